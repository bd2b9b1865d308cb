"""trainwise: plan, check, prepare, train, diagnose, evaluate and monitor PyTorch training."""
from trainwise.config import RunConfig, config_from_dict, load_config
from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec
from trainwise.errors import TrainwiseError
from trainwise.run import RunDir
from trainwise.train.callbacks import Callback
from trainwise.train.trainer import Trainer

__version__ = "0.1.0"
__all__ = ["ArrayDataset", "Callback", "DataBundle", "DataSpec", "RunConfig", "RunDir", "Trainer",
           "TrainwiseError", "config_from_dict", "load_config"]
