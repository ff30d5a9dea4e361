"""Training tasks shared by demos, the viewer and tests: learning an image (`tinn.tasks.image`) and the
image demo behind the `tinn-image` command (`tinn.tasks.image_demo`). The modules are not imported here, so
that `import tinn.tasks.image_demo` (the command's `--help`) does not bind the kernels before `tinn.init`."""

__all__ = ["image", "image_demo"]
