"""The code that runs inside the sandbox's own interpreter (`python -I -S -B` of this folder): standard library
only, and nothing from the host side. The host imports `codec` (to decode values) and `cgroup` (to detect)."""
