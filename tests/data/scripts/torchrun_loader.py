"""Run under torchrun (2 ranks): build the self-cognition dataset and its stream on every rank; record the batches."""

import json
import os
import sys

import torch.distributed as dist

import twinkle
from twinkle import DeviceMesh
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta, IterableDataset
from twinkle.preprocessor import SelfCognitionProcessor

out_dir = sys.argv[1]
runtime = twinkle.initialize(global_device_mesh=DeviceMesh.from_sizes(dp_size=2), seed=7)
dataset = Dataset(dataset_meta=DatasetMeta("twinkle://self-cognition", data_slice=range(40)))
dataset.set_template("Qwen3_5Template", model_id="twinkle://tiny-qwen", max_length=128, truncation_strategy="raise")
dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
dataset.encode()
loader = DataLoader(dataset=dataset, batch_size=8)
first_two = [[row["input_ids"] for row in batch] for _, batch in zip(range(2), loader)]
resumed = DataLoader(dataset=dataset, batch_size=8)
resumed.resume_from_checkpoint(loader.get_state()["consumed_train_samples"])
rest = [[row["input_ids"] for row in batch] for batch in resumed]
# the same rows streamed: map + encode on the fly in 2 DataLoader workers per rank, resumed after 2 batches
stream = IterableDataset(DatasetMeta("twinkle://self-cognition", data_slice=range(40)))
stream.set_template("Qwen3_5Template", model_id="twinkle://tiny-qwen", max_length=128, truncation_strategy="raise")
stream.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
stream.encode()
stream_loader = DataLoader(dataset=stream, batch_size=8, shuffle_buffer=16, num_workers=2)
stream_head = [[row["input_ids"] for row in batch] for _, batch in zip(range(2), stream_loader)]
stream_resumed = DataLoader(dataset=stream, batch_size=8, shuffle_buffer=16, num_workers=2)
stream_resumed.resume_from_checkpoint(stream_loader.get_state()["consumed_train_samples"])
stream_rest = [[row["input_ids"] for row in batch] for batch in stream_resumed]
with open(os.path.join(out_dir, f"rank{runtime.rank}.json"), "w") as f:
    json.dump({"data_rank": loader.data_rank, "batches": first_two + rest, "len": len(loader),
               "state": resumed.get_state(), "stream_batches": stream_head + stream_rest,
               "stream_state": stream_resumed.get_state()}, f)
dist.barrier()
dist.destroy_process_group()
