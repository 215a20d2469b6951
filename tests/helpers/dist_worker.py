"""Run under torchrun by tests/test_distributed.py: a few PPO updates, then each rank writes what it holds."""

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from rlspeed import PPO
from rlspeed.distributed import DistributedStrategy

out = Path(sys.argv[1])
strategy = DistributedStrategy()
model = PPO("Pendulum-v1", seed=3, strategy=strategy, num_envs=4, num_steps=32, batch_size=64, n_epochs=2,
            normalize_obs=True, normalize_reward=True)
model.learn(3 * 32 * 4, progress_bar=False)  # three iterations of all ranks together
tensors = {f"policy.{k}": v.contiguous() for k, v in model.policy.state_dict().items()}
tensors.update({f"obs_rms.{k}": v.contiguous() for k, v in model.obs_rms.state_dict().items()})
save_file(tensors, str(out / f"rank{strategy.rank}.safetensors"))
# rank 0's word (the run directory's refusal, `rlspeed.cli._prepare_workers_run_dir`), none, or empty, on every rank
words = [strategy.broadcast_text(text if strategy.is_main else "not rank 0's")
         for text in (None, "", "refusé: 'run\udcff'")]
(out / f"rank{strategy.rank}.json").write_text(json.dumps({
    "num_timesteps": model.num_timesteps, "local_envs": model._env.num_envs, "world_size": strategy.world_size,
    "words": words}))
strategy.leave()
