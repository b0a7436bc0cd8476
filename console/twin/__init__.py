"""A GPU host in a box: a simulated SGLang server with systemctl/nvidia-smi stand-ins, a journal, and SSH."""
