"""A training script run by `warmup --script`: only its compiles matter. Takes --width like a real script."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, required=True)
args = parser.parse_args()
x = jnp.ones((args.width,), jnp.float32)
print(jax.jit(lambda v: (v * 3.0).sum())(x))
