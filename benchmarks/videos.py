"""Videos of trained agents, checked with a reader: the command line a user types, end to end.

For PPO on CartPole-v1 and SAC on Pendulum-v1: `rlspeed train ALGO ENV --out runs/videos/<algo>-<env>` (the shipped
preset, stopping at the env's target return), then `rlspeed eval RUN --json --video runs/videos/<algo>-<env>.mp4`
(one deterministic episode filmed, the 10-episode evaluation alongside). Each file is then opened with imageio (its
ffmpeg reader) and read frame by frame: frame count, frame size, and the container's fps and duration are reported
with the training result and the returns. The videos stay under runs/ (gitignored); only the numbers are kept
(results/export_videos.json and the README section).

Usage: python benchmarks/videos.py [--no-write]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import common

ROOT = common.BENCHMARKS_DIR.parent
OUT = ROOT / "runs" / "videos"
CASES = [("ppo", "CartPole-v1"), ("sac", "Pendulum-v1")]


def rlspeed(*args: str) -> tuple[str, str]:
    """Run the `rlspeed` command (this interpreter's) and return (stdout, stderr); raise with its stderr if it
    fails."""
    command = [sys.executable, "-m", "rlspeed", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done.stdout, done.stderr


def read_video(path: Path) -> dict:
    """What a player sees: frames decoded one by one with imageio's ffmpeg reader, their size, fps and duration."""
    import imageio.v2 as imageio

    reader = imageio.get_reader(str(path), format="ffmpeg")
    meta = reader.get_meta_data()
    frames, shapes = 0, set()
    for frame in reader:
        frames += 1
        shapes.add(tuple(frame.shape))
    reader.close()
    return {"frames_read": frames, "frame_shapes": sorted(list(s) for s in shapes), "fps": meta.get("fps"),
            "duration_s": meta.get("duration"), "codec": meta.get("codec"), "bytes": path.stat().st_size}


def run_case(algo: str, env_id: str) -> dict:
    name = f"{algo}-{env_id}"
    run_dir, video = OUT / name, OUT / f"{name}.mp4"
    for stale in (video, video.with_suffix(".mp4.json")):
        stale.unlink(missing_ok=True)
    if run_dir.exists():  # rlspeed never overwrites a run directory: a new name per run
        run_dir = OUT / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    begin = time.perf_counter()
    rlspeed("train", algo, env_id, "--seed", "0", "--out", str(run_dir))
    train_s = time.perf_counter() - begin
    summary = json.loads((run_dir / "summary.json").read_text())
    stdout, stderr = rlspeed("eval", str(run_dir), "--json", "--video", str(video))
    evaluation = json.loads(stdout)
    # the video's own line: "rlspeed: wrote PATH (E episodes, F frames, return R)"
    said = re.search(r"wrote .* \((\d+) episodes?, (\d+) frames, return (-?[\d.]+)\)", stderr)
    filmed = ({"episodes": int(said[1]), "frames": int(said[2]), "return": float(said[3])} if said
              else {"line": stderr.strip().splitlines()[-1:]})
    return {"algo": algo, "env_id": env_id, "run_dir": str(run_dir.relative_to(ROOT)),
            "video": str(video.relative_to(ROOT)), "train_wall_clock_s": round(train_s, 1),
            "target_return": summary.get("target_return"), "steps_to_target": summary.get("steps_to_target"),
            "time_to_target_s": summary.get("time_to_target_s"), "final_eval": summary.get("final_eval"),
            "eval": evaluation, "filmed": filmed, "file": read_video(video)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print only: no results JSON, no README section")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    load_before = common.load_average()
    results = []
    for algo, env_id in CASES:
        print(f"{algo} {env_id}: training with the shipped preset to the target ...", flush=True)
        results.append(run_case(algo, env_id))
        print(json.dumps(results[-1], indent=1), flush=True)
    load_after = common.load_average()
    rows = []
    for r in results:
        video, file = r["filmed"], r["file"]
        rows.append([f"{r['algo'].upper()} {r['env_id']}",
                     f"{common.fmt(r['steps_to_target'], ',')} steps, {common.fmt(r['time_to_target_s'], '.1f')} s "
                     f"(target {r['target_return']:g})",
                     f"{r['eval']['mean']:.1f} ± {r['eval']['std']:.1f}",
                     f"{video.get('return', float('nan')):.1f}",
                     f"{file['frames_read']} (rlspeed: {video.get('frames', '?')})",
                     " / ".join("x".join(str(d) for d in shape) for shape in file["frame_shapes"]),
                     f"{file['fps']:g} fps, {file['duration_s']:.2f} s, {file['codec']}, "
                     f"{file['bytes'] / 1024:.0f} KiB"])
    table = common.markdown_table(["agent", "trained (shipped preset) to the target", "eval return (10 episodes)",
                                   "filmed episode return", "frames decoded", "frame size (HxWxC)", "file"], rows)
    lines = ["## Videos of trained agents (`benchmarks/videos.py`)", "",
             "`rlspeed train ALGO ENV` with the shipped preset (stopping at the target return), then `rlspeed eval "
             "RUN --video FILE.mp4`; each file decoded frame by frame with imageio's ffmpeg reader. The videos stay "
             "under runs/videos/ (gitignored). Load average (1, 5, 15 min): "
             f"{load_before} before, {load_after} after.", "", table]
    data = {"load_before": load_before, "load_after": load_after, "cases": results}
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "imageio", "imageio-ffmpeg", "pygame-ce"))
    machine["torch_threads"] = 1  # (the `rlspeed train` and `eval` processes': their --threads default)
    common.publish("export_videos", lines, data, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
