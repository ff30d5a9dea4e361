"""Training fields on scenes: photometric training through the compositor, distillation from a teacher field,
octree training through image pyramids, and level-of-detail evaluation against area-filtered truth."""
from .distillation import Distiller
from .octree_training import OctreeTrainer
from .photometric import PhotometricTrainer

__all__ = ["PhotometricTrainer", "Distiller", "OctreeTrainer"]
