"""One product over the ranks of a ``torch.distributed`` process group (``lcmac.distributed``),
built on ``lcmac.matmul`` for each rank's own products."""
