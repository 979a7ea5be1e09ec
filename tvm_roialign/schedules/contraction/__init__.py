"""The fp32 convolution and matmul rules of the CPU pipeline: the register-tiled contraction they
share (:mod:`.schedule`, its analysis and tile cost model), NHWC conv2d, matmul, depthwise and
grouped convolutions, and Winograd's transforms."""
