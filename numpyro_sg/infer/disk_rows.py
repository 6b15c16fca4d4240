r"""Data larger than memory: rows read from a ``.npy`` file on disk inside the compiled sampler.

A :class:`NpyRows` stands for the rows of a ``.npy`` array opened as a memory map
(``np.load(path, mmap_mode="r")``): the model reads the rows of its mini-batch with a call,
``X(idx)``, which inside ``jit`` is a ``jax.pure_callback`` returning ``X[idx]`` from the file
(the operating system's page cache keeps the hot pages; nothing holds the whole array in
memory).  The kernels draw the indices as usual, so the mini-batches stay exactly uniform, and
the warmup's full-data passes visit the rows in chunks (``WarmupOptions.chunk_size``), each chunk
read when the pass reaches it::

    X, y = NpyRows("X.npy"), NpyRows("y.npy")

    def model(X, y):
        theta = numpyro.sample("theta", dist.Normal(0, 3).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.num_rows, subsample_size=1000) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X(idx) @ theta), obs=y(idx))

    MCMC(nsg.SGLD(model), ..., jit_model_args=True).run(key, X, y)

Reading rows one by one is random access: fast from the page cache or an SSD; on a spinning disk
shuffle the rows once when writing the file and read windows of contiguous rows instead.
A :class:`NpyRows` is a pytree without leaves, so it passes through ``jit`` as static structure.

Parquet files (compressed, by row groups: no cheap random row access) are streamed once into a
``.npy`` file by :func:`npy_from_parquet` (pyarrow; memory of one batch of rows), then read as
above.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["NpyRows", "npy_from_parquet"]


@jax.tree_util.register_pytree_node_class
class NpyRows:
    """The rows of the ``.npy`` file ``path``, read on demand (module docstring).

    ``rows(idx)`` returns the rows ``idx`` (any integer array shape; the row shape appended) as a
    JAX array; ``num_rows`` and ``shape`` describe the whole array without reading it.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(12.0, dtype=np.float32).reshape(6, 2))
    >>> X = NpyRows(path)
    >>> X.num_rows, jax.jit(lambda i: X(i))(np.array([4, 1])).tolist()
    (6, [[8.0, 9.0], [2.0, 3.0]])
    """

    def __init__(self, path):
        self.path = str(path)
        self.array = np.load(self.path, mmap_mode="r")

    @property
    def num_rows(self) -> int:
        """N, the number of rows."""
        return int(self.array.shape[0])

    @property
    def shape(self) -> tuple:
        """The array's shape."""
        return tuple(self.array.shape)

    @property
    def dtype(self):
        """The array's dtype."""
        return self.array.dtype

    def _read(self, idx):
        idx = np.asarray(idx)
        return np.ascontiguousarray(self.array[idx.reshape(-1)]).reshape(idx.shape + self.array.shape[1:])

    def __call__(self, idx):
        """The rows ``idx`` (read from the file when the compiled program runs)."""
        out = jax.ShapeDtypeStruct(np.shape(idx) + self.array.shape[1:], self.array.dtype)
        return jax.pure_callback(self._read, out, idx, vmap_method="expand_dims")

    def tree_flatten(self):
        """No leaves: the file is static structure of a compiled program."""
        return (), self.path

    @classmethod
    def tree_unflatten(cls, path, _):
        """Reopen the file (a memory map: no read)."""
        return cls(path)

    def __eq__(self, other):
        return isinstance(other, NpyRows) and other.path == self.path

    def __hash__(self):
        return hash(("NpyRows", self.path))


def npy_from_parquet(path, columns, out_path, dtype=np.float32, batch_rows: int = 65536,
                     shuffle_seed: int | None = None) -> NpyRows:
    """Write the ``columns`` of the Parquet file ``path`` as the columns of a ``.npy`` array
    ``out_path`` (rows × len(columns); one column name: a vector), streaming ``batch_rows`` rows
    at a time with pyarrow (memory O(row group + batch_rows·columns), never the whole table), and
    return it as :class:`NpyRows`.  ``shuffle_seed``: also permute the rows (a random permutation of
    N indices, O(N) memory, written by scattering each batch), the one shuffle at write time
    that makes windows of contiguous rows random samples.

    >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> folder = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]}), f"{folder}/t.parquet")
    >>> npy_from_parquet(f"{folder}/t.parquet", ["b", "a"], f"{folder}/x.npy").array.tolist()
    [[4.0, 1.0], [5.0, 2.0], [6.0, 3.0]]
    """
    import pyarrow.parquet as pq  # optional dependency (pip install pyarrow)

    single = isinstance(columns, str)
    columns = [columns] if single else list(columns)
    # no pre-buffering, a small read buffer and one decoding thread: pyarrow's defaults (whole row
    # groups buffered, a thread pool's per-thread memory) hold many times more (measured:
    # docs/big_data.md, "Data larger than memory")
    source = pq.ParquetFile(str(path), pre_buffer=False, buffer_size=1 << 20)
    N = source.metadata.num_rows
    shape = (N,) if single else (N, len(columns))
    out = np.lib.format.open_memmap(str(out_path), mode="w+", dtype=dtype, shape=shape)
    perm = None if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(N)
    start = 0
    for batch in source.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
        block = np.stack([batch.column(c).to_numpy(zero_copy_only=False) for c in columns], axis=1)
        block = block[:, 0] if single else block
        where = slice(start, start + len(block)) if perm is None else perm[start:start + len(block)]
        out[where] = block.astype(dtype)
        start += len(block)
    out.flush()
    del out
    return NpyRows(out_path)
