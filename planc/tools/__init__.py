"""Tools beside the loader: synthetic checkpoints (`synth`, `synth_fp4`, `synth_gguf`) and the probe.
"""
