#!/usr/bin/env bash
# Prints the configure preset for this machine: "default" (CUDA) where nvcc exists, else "cpu".
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then echo default; else echo cpu; fi
