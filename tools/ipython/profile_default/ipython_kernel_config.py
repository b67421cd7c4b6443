# Kernel settings for `make execute` and `make test` (they set IPYTHONDIR here).
# TensorFlow's C++ runtime writes start-up lines straight to file descriptor 2
# (which device it found, which CPU kernels it uses). Keep them in the terminal,
# not in the stored notebook outputs, so outputs are the same on every machine.
c = get_config()  # noqa: F821
c.IPKernelApp.capture_fd_output = False
# Store figures in the notebook (inline PNG), whatever MPLBACKEND says.
c.InteractiveShellApp.matplotlib = "inline"
