"""What every anchors_*.py script times with: the median of CUDA-event
timings (as stheno's benchmarks time themselves), and the GPU's copy
bandwidth, the ceiling of a memory-bound op's GB/s.

The scripts import it from their own directory (python3 puts a script's
directory first on sys.path), so run them from anywhere.
"""
import torch


def median_ms(fn, warmup=5, reps=30):
    """The median time of fn() in ms over reps calls, each between two CUDA
    events on the current stream, after warmup calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def copy_gbs(nbytes=1 << 28):
    """The device-to-device copy bandwidth in GB/s: a copy of nbytes (256 MiB,
    well past the L2) between two buffers, counting the bytes read and
    written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


if __name__ == "__main__":
    print(f"{torch.cuda.get_device_name()}: device copy {copy_gbs():.0f} GB/s (read + write, 256 MiB)")
