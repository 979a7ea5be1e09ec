"""A build's precision: fp32, bf16 or int8 for a target, the layers kept in fp32, the calibration
inputs of int8 and the graph phase of an ONNX QDQ model."""
