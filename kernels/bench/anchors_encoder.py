#!/usr/bin/env python3
"""Prints stheno's encoder-shaped training step (ops' BenchmarkGPUEncoderStep)
beside PyTorch's (../shared/anchors/encoder_stack/encoder_step.py), from the
same run on the same GPU: ms per step, the ratio (PyTorch's time over
stheno's: above 1 is faster), and peak memory with its ratio (stheno's over
PyTorch's). gpu-check.sh's encoder step runs both and calls this.

    python3 kernels/bench/anchors_encoder.py --stheno encoder.log --torch encoder-anchor.log
"""
import argparse
import re


def stheno_rows(path):
    """(n, layers, machine) -> metrics, from `go test -bench` lines."""
    rows = {}
    pat = re.compile(r"^BenchmarkGPUEncoderStep/n=(\d+)/layers=(\d+)/machine=(\w+)\S*\s+\d+\s+(.*)$")
    for line in open(path):
        m = pat.match(line.strip())
        if not m:
            continue
        vals = m.group(4).split()
        metrics = {vals[i + 1]: float(vals[i]) for i in range(0, len(vals) - 1, 2)}
        rows[(int(m.group(1)), int(m.group(2)), m.group(3))] = metrics
    return rows


def torch_rows(path):
    """(n, layers) -> (ms, peak GiB), from encoder_step.py's lines."""
    rows = {}
    pat = re.compile(r"n=(\d+) tokens=\d+ layers=(\d+) ms_per_step=([\d.]+) peak_GiB=([\d.]+)")
    gpu = None
    for line in open(path):
        m = pat.search(line)
        if m:
            rows[(int(m.group(1)), int(m.group(2)))] = (float(m.group(3)), float(m.group(4)))
            g = re.search(r"gpu='([^']*)'", line)
            gpu = g.group(1) if g else gpu
    return rows, gpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stheno", required=True)
    ap.add_argument("--torch", required=True)
    a = ap.parse_args()
    st = stheno_rows(a.stheno)
    pt, gpu = torch_rows(a.torch)
    print(f"encoder-shaped training step, same run, GPU {gpu}")
    head = f"{'config':<16} {'machine':<9} {'ms':>7} {'torch ms':>8} {'speed':>6} {'host ms':>7} {'us/node':>7} {'idle us/node':>12} {'gpu ms':>7} {'GiB':>6} {'torch GiB':>9} {'mem':>5} {'launch':>6} {'gemm':>5} {'wait':>4}"
    print(head)
    for (n, layers, machine), m in sorted(st.items()):
        ms, peak = m.get("ms", float("nan")), m.get("peak-GiB", float("nan"))
        tms, tpeak = pt.get((n, layers), (float("nan"), float("nan")))
        print(f"{f'n={n} layers={layers}':<16} {machine:<9} {ms:7.2f} {tms:8.2f} {tms / ms:6.2f} "
              f"{m.get('host-ms', float('nan')):7.2f} {m.get('host-us/node', float('nan')):7.2f} "
              f"{m.get('idle-host-us/node', float('nan')):12.2f} {m.get('gpu-ms', float('nan')):7.2f} {peak:6.2f} {tpeak:9.2f} {peak / tpeak:5.2f} "
              f"{m.get('launches', 0):6.0f} {m.get('gemms', 0):5.0f} {m.get('waits', 0):4.0f}")
    if not pt:
        print("PyTorch's step was not measured (no encoder_stack anchor, or its kernels did not build)")


if __name__ == "__main__":
    main()
