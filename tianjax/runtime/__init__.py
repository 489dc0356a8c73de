"""The runtime shell: loops that call the pure core and do the I/O around it."""
