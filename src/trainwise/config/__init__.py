"""Foundation: the run's config. `schema.py` is the typed schema (a section per concern, a description on every
field, data only); `load.py` reads recipes and dotted overrides; `messages.py` says what is wrong with a
config; `diff.py` compares configs (resume, compare); `derived.py` owns the numbers derived from one
(accumulation steps, warmup steps, which way a metric improves); `labels.py` the label value that carries
no loss (IGNORE_INDEX). It imports no room.

    from trainwise.config import RunConfig, load_config
"""
from trainwise.config.derived import (LOWER_IS_BETTER_PARTS, accumulation_steps, lower_is_better, metric_mode,
                                      warmup_steps)
from trainwise.config.load import apply_override, config_from_dict, dump_yaml, load_config, parse_value
from trainwise.config.messages import field_description, field_reference
from trainwise.config.schema import (MAX_NUM_WORKERS, MAX_SEED, MAX_TELEMETRY_INTERVAL_S, MIN_TELEMETRY_INTERVAL_S,
                                     CheckpointConfig, DataConfig, EarlyStoppingConfig, EvalConfig, LoraConfig,
                                     ModelConfig, OptimConfig, RunConfig, ScheduleConfig, Section, TelemetryConfig,
                                     TrainConfig)

__all__ = [
    "LOWER_IS_BETTER_PARTS", "MAX_NUM_WORKERS", "MAX_SEED", "MAX_TELEMETRY_INTERVAL_S", "MIN_TELEMETRY_INTERVAL_S",
    "CheckpointConfig", "DataConfig", "EarlyStoppingConfig", "EvalConfig", "LoraConfig", "ModelConfig",
    "OptimConfig", "RunConfig", "ScheduleConfig", "Section", "TelemetryConfig", "TrainConfig",
    "accumulation_steps", "apply_override", "config_from_dict", "dump_yaml", "field_description",
    "field_reference", "load_config", "lower_is_better", "metric_mode", "parse_value", "warmup_steps",
]
