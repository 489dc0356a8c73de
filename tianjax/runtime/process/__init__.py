"""The OS around a role: clean shutdown on signals (`shutdown`), descriptor limits and resource
errors (`resources`), the persistent compile cache (`compile_cache`)."""
