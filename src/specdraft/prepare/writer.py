"""Writing ``RUN/prepare/dataset/`` (``datasets.save_to_disk``, memory-mappable Arrow).

Rows are streamed into one Arrow IPC file while prepare runs (memory stays flat), which
``datasets.Dataset.from_file`` maps without loading; ``save_to_disk`` then writes the final
shards into a temporary directory renamed into place (``specdraft.core.atomic.atomic_dir``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.core.atomic import atomic_dir

COLUMNS = ("input_ids", "loss_mask", "sample_id", "turn_index", "seq_len", "truncated")


def features() -> Any:
    """The dataset schema of docs/run-dir.md."""
    import datasets

    return datasets.Features({
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("uint8")),
        "sample_id": datasets.Value("string"),
        "turn_index": datasets.Value("int32"),
        "seq_len": datasets.Value("int32"),
        "truncated": datasets.Value("bool"),
    })


class DatasetWriter:
    """Streams rows to ``stream_path`` (Arrow IPC), then :meth:`finish` saves the dataset."""

    def __init__(self, stream_path: Path, batch_rows: int = 512) -> None:
        import pyarrow as pa

        self._features = features()
        self._schema = self._features.arrow_schema
        self.stream_path = stream_path
        self._sink = pa.OSFile(str(stream_path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self._schema)
        self._rows: list[dict[str, Any]] = []
        self._batch_rows = batch_rows
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        """Append a row with exactly :data:`COLUMNS`."""
        self._rows.append(row)
        self.count += 1
        if len(self._rows) >= self._batch_rows:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._rows:
            table = pa.Table.from_pylist(self._rows, schema=self._schema)
            self._writer.write_table(table)
            self._rows.clear()

    def finish(self, out_dir: Path) -> None:
        """Close the stream and atomically write ``out_dir`` with ``save_to_disk``."""
        import datasets

        self._flush()
        self._writer.close()
        self._sink.close()
        ds = datasets.Dataset.from_file(str(self.stream_path),
                                        info=datasets.DatasetInfo(features=self._features))
        with atomic_dir(out_dir) as tmp:
            ds.save_to_disk(str(tmp))
        del ds
        self.stream_path.unlink()

    def abort(self) -> None:
        """Close and delete the stream file (after an error)."""
        for closer in (self._writer.close, self._sink.close):
            try:
                closer()
            except Exception:  # already closed by finish(); nothing else to release
                pass
        self.stream_path.unlink(missing_ok=True)
