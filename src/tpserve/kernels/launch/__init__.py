"""How kernels launch: programmatic dependent launch in Triton, the driver's cuLaunchKernelEx for NVRTC ones."""
