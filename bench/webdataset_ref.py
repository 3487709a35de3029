"""The reference for bench/cifar.sh: WebDataset's recommended CIFAR pipeline, RE-IMPLEMENTED on Debian's python.

WebDataset itself is not installable here (not packaged by Debian; PyPI unreachable), so this file writes
out, per sample, what WebDataset 0.2/1.0 does for
    wds.WebDataset(urls, shardshuffle=True).shuffle(N).decode("rgb8").to_tuple("ppm", "cls")
       .map_tuple(augment, None).batched(B)  fed to  torch.utils.data.DataLoader(num_workers=W, batch_size=None)
read from its source (webdataset/shardlists.py, tariterators.py, filters.py, autodecode.py, compat.py):
  - shard list: shuffled with the seed, then split over DataLoader workers (split_by_worker: urls[id::n]);
  - tar stream: tarfile.open(fileobj, mode="r|*"), regular members only, each member's bytes read whole,
    grouped into samples by consecutive key (base_plus_ext: the path up to the first dot of the basename),
    suffix lower-cased, `__key__` and `__url__` added;
  - shuffle(N): filters._shuffle's buffer (bufsize N, initial 100, two appends a step, pick = swap with last);
  - decode("rgb8"): PIL.Image.open + load + convert("RGB") + np.asarray (uint8 HWC); .cls: int(bytes);
  - augment, as graphs/cifar10_train.yaml's (torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip
    + ToTensor + Normalize, written in numpy because torchvision is not in Debian): zero padding 4, random
    32x32 crop, flip with p 0.5, /255, (x - mean) / std, CHW float32 torch tensor;
  - batched(B): lists of B samples, collated by default_collation_fn (torch.stack of the images, a numpy
    array of the labels), the last short batch kept (partial=True).
Timing starts when the DataLoader is made (after `import torch`) and ends at the last batch, so worker
start-up counts and the interpreter's start does not; CPU time (this process and its DataLoader workers,
user + system) is counted over the same span, the workers' once they have exited.
    /usr/bin/python3 bench/webdataset_ref.py 'DIR/cifar-train-{000000..000009}.tar' [--workers 2]
Prints one line: "samples N seconds S samples/s R cpu-seconds C".
"""

import argparse
import gzip
import io
import random
import re
import resource
import tarfile
import time

import numpy as np
import PIL.Image
import torch

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)  # graphs/cifar10_train.yaml's augment
STD = np.array([0.2023, 0.1994, 0.2010], np.float32)


def expand(pattern):
    """Brace expansion of one {A..B} range (WebDataset uses braceexpand), zero-padded like A."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if not m:
        return [pattern]
    a, b = m.group(1), m.group(2)
    return [pattern[:m.start()] + str(i).zfill(len(a)) + pattern[m.end():] for i in range(int(a), int(b) + 1)]


def tar_samples(url):
    """tariterators.tar_file_iterator + group_by_keys over one shard (streaming tarfile)."""
    current = None
    with open(url, "rb") as f:
        stream = tarfile.open(fileobj=f, mode="r|*")
        for info in stream:
            if not info.isreg():
                continue
            m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", info.name)
            if not m:
                continue
            data = stream.extractfile(info).read()
            stream.members = []
            prefix, suffix = m.group(1), m.group(2).lower()
            if current is None or prefix != current["__key__"]:
                if current is not None:
                    yield current
                current = {"__key__": prefix, "__url__": url}
            current[suffix] = data
    if current is not None:
        yield current


def shuffled(data, rng, bufsize, initial=100):
    """filters._shuffle: a bounded buffer, two appends a step while filling, pick = swap with the last."""
    initial = min(initial, bufsize)
    buf = []
    for sample in data:
        buf.append(sample)
        if len(buf) < bufsize:
            try:
                buf.append(next(data))
            except StopIteration:
                pass
        if len(buf) >= initial:
            k = rng.randint(0, len(buf) - 1)
            buf[k], buf[-1] = buf[-1], buf[k]
            yield buf.pop()
    while buf:
        k = rng.randint(0, len(buf) - 1)
        buf[k], buf[-1] = buf[-1], buf[k]
        yield buf.pop()


IMAGE_EXTENSIONS = "jpg jpeg png ppm pgm pbm pnm".split()
INT_EXTENSIONS = "cls cls2 class count index inx id".split()


def gzfilter(key, data):
    """autodecode.gzfilter (a pre-handler): a .gz field is decompressed, then decoded by its inner name."""
    if not key.endswith(".gz"):
        return None
    return decode_field(key[:-3], gzip.decompress(data))


def decode_rgb8(key, data):
    """autodecode.ImageHandler("rgb8")."""
    if re.sub(r".*[.]", "", key).lower() not in IMAGE_EXTENSIONS:
        return None
    with io.BytesIO(data) as stream:
        img = PIL.Image.open(stream)
        img.load()
        img = img.convert("RGB")
    result = np.asarray(img)
    assert result.ndim == 3 and result.shape[2] == 3
    return result


def basichandlers(key, data):
    """autodecode.basichandlers, the part these shards reach (.cls: int)."""
    if re.sub(r".*[.]", "", key).lower() in INT_EXTENSIONS:
        return int(data)
    return None


def decode_field(key, data):
    """autodecode.Decoder.decode1: the handler list in order, the first result that is not None wins."""
    for f in (gzfilter, decode_rgb8, basichandlers):
        r = f(key, data)
        if r is not None:
            return r
    return data


def decode(sample):
    """autodecode.Decoder.decode: every field but the __meta__ ones."""
    return {k: v if k.startswith("__") else decode_field("." + k, v) for k, v in sample.items()}


def augment(img, rng):
    """RandomCrop(32, padding=4), RandomHorizontalFlip(), ToTensor(), Normalize(MEAN, STD)."""
    padded = np.pad(img, ((4, 4), (4, 4), (0, 0)))
    y, x = rng.randint(0, padded.shape[0] - 32), rng.randint(0, padded.shape[1] - 32)
    out = padded[y:y + 32, x:x + 32]
    if rng.random() < 0.5:
        out = out[:, ::-1]
    out = (out.astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))


def collate(samples):
    """filters.default_collation_fn for (tensor, int) tuples."""
    images, labels = zip(*samples)
    return [torch.stack(list(images)), np.array(labels)]


class Dataset(torch.utils.data.IterableDataset):
    def __init__(self, urls, seed, bufsize, batch_size):
        self.urls, self.seed, self.bufsize, self.batch_size = urls, seed, bufsize, batch_size

    def __iter__(self):
        urls = list(self.urls)
        random.Random(self.seed).shuffle(urls)  # shardshuffle
        info = torch.utils.data.get_worker_info()
        if info is not None:  # shardlists.split_by_worker
            urls = urls[info.id::info.num_workers]
        rng = random.Random()  # DataLoader seeds each worker's `random`; this follows the same idea
        samples = (s for url in urls for s in tar_samples(url))
        batch = []
        for s in shuffled(samples, rng, self.bufsize):
            s = decode(s)
            image, label = (s["ppm"], s["cls"])  # .to_tuple("ppm", "cls")
            batch.append((augment(image, rng), label))  # .map_tuple(augment, None)
            if len(batch) == self.batch_size:
                yield collate(batch)
                batch = []
        if batch:
            yield collate(batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("urls", help="shard pattern with one {A..B} range, local paths")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers (0: in the main process)")
    ap.add_argument("--batch-size", type=int, default=128, help="the graph's batch size")
    ap.add_argument("--shuffle", type=int, default=10000, help="shuffle buffer (the graph's buffer_size)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)

    def cpu():
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))

    start, cpu_start = time.perf_counter(), cpu()
    loader = torch.utils.data.DataLoader(Dataset(expand(a.urls), a.seed, a.shuffle, a.batch_size),
                                         num_workers=a.workers, batch_size=None)
    n = 0
    it = iter(loader)
    for images, labels in it:
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
        n += len(labels)
    seconds = time.perf_counter() - start
    del it  # joins the workers: their CPU time is then counted
    print(f"samples {n} seconds {seconds:.3f} samples/s {n / seconds:.1f} cpu-seconds {cpu() - cpu_start:.3f}")


if __name__ == "__main__":
    main()
