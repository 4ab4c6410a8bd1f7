"""Run at start-up by every process of the Mooncake engines of `kvmoq bench vllm` (this
folder is on their PYTHONPATH, and Python imports `sitecustomize` wherever it finds one).

vLLM 0.32's MooncakeConnector asks `torch.accelerator.current_device_index()` for the device
its transfer engine serves (`MooncakeConnectorWorker.__init__`), and torch raises there when
the machine has no accelerator, so the connector cannot start on a CPU although Mooncake's
TCP transport needs none. Where there is no accelerator the answer here is device 0, the
index vLLM's CPU platform sets; with one, torch answers. Nothing else is touched.
"""

import torch

_current_device_index = torch.accelerator.current_device_index


def current_device_index() -> int:
    if not torch.accelerator.is_available():
        return 0
    return _current_device_index()


torch.accelerator.current_device_index = current_device_index
