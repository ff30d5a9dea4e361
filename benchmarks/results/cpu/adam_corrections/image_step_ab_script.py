import time, torch, tinn
tinn.init(arch="cpu")
from tinn.trainer import Trainer
from tinn.tasks.image import ImageTask, default_image
cfg = tinn.load_config("tinn/configs/config_hash.json")
tr = Trainer.from_config(cfg, 2, 3)
task = ImageTask(default_image(256))
bs=[task.batch(1 << 14) for _ in range(4)]
for b in bs: tr.training_step(*b)
res=[]
for _ in range(5):
    t0=time.perf_counter()
    for i in range(20): tr.training_step(*bs[i%4])
    res.append((time.perf_counter()-t0)/20*1e3)
print("image step 2^14 ms", round(min(res),2))
res=[]
for _ in range(5):
    t0=time.perf_counter()
    for i in range(20): tr.optimizer.step()
    res.append((time.perf_counter()-t0)/20*1e3)
print("optimizer.step ms", round(min(res),2), [tuple(p.shape) for p in tr.model.parameters()])
