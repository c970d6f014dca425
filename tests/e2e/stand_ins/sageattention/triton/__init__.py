"""Test stand-in for `sageattention.triton`, not the library."""
