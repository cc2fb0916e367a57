"""bench/udf.sh's input: the taxi Parquet files with their two timestamp columns as epoch
microseconds (`pickup_micros`, `dropoff_micros`), since Beam YAML's ReadFromParquet cannot read
Parquet timestamps. usage: udf_data.py SRC_DIR DST_DIR"""
import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq

src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for f in sorted(src.glob("*.parquet")):
    t = pq.read_table(f)
    for old, new in [("tpep_pickup_datetime", "pickup_micros"), ("tpep_dropoff_datetime", "dropoff_micros")]:
        i = t.schema.get_field_index(old)
        micros = t.column(i).cast(pa.timestamp("us")).cast(pa.int64())
        t = t.set_column(i, new, micros)
    pq.write_table(t, dst / f.name, compression="snappy")
print(f"converted {len(list(src.glob('*.parquet')))} files into {dst}")
