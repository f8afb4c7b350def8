"""The measurement store (ado's "sample store"): measurements reused across studies.

Every ok or oom measurement a study makes is kept in a table next to the study's Optuna tables,
keyed by the canonical configuration, the workload and the hardware. A study that proposes a
configuration already measured with the same workload on the same hardware, by itself or by any
other study in the same storage, is answered from the store instead of running it
(``reuse_measurements: false`` in the study file turns this off).
"""

from explorer.store._keys import StoreScope, hardware_key, job_identity, workload_key
from explorer.store._store import TABLE_NAME, MeasurementStore, StoredMeasurement

__all__ = [
    "TABLE_NAME",
    "MeasurementStore",
    "StoreScope",
    "StoredMeasurement",
    "hardware_key",
    "job_identity",
    "workload_key",
]
