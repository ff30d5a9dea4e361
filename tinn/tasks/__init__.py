"""Training tasks shared by demos, the viewer and tests."""
