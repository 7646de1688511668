"""The peak-RSS sampler the memory benchmarks' children share, as source prepended to each child's ``-c`` text.

A child runs in a temporary directory with a source tree's own Python, where
``tools/`` is not importable; so the sampler travels as text. It defines
``rss()`` (bytes now), ``peak`` (``[bytes]``, the highest sample) and
``done`` (set it to stop); ``start_sampling()`` starts the 5 ms sampler.
"""

SAMPLER = """
import os, threading
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
peak, done = [0], threading.Event()
def sample():
    while not done.wait(0.005):
        peak[0] = max(peak[0], rss())
def start_sampling():
    threading.Thread(target=sample, daemon=True).start()
"""
