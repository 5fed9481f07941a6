"""`tpserve snapshot list|rm`: the processed-weight snapshots on this machine (model/snapshot.py)."""

from __future__ import annotations


def register(sub, bench, tune) -> None:
    p = sub.add_parser("snapshot", help="list or remove processed-weight snapshots")
    what = p.add_subparsers(dest="snapshot_command", required=True, metavar="WHAT")
    ls = what.add_parser("list", help="list snapshots (id, size, ranks, checkpoint, quantization)")
    ls.add_argument("--snapshot-dir", default=None, help="default: <cache dir>/snapshots")
    ls.set_defaults(func=_list)
    rm = what.add_parser("rm", help="remove snapshots by id (or --all)")
    rm.add_argument("ids", nargs="*")
    rm.add_argument("--all", action="store_true")
    rm.add_argument("--snapshot-dir", default=None, help="default: <cache dir>/snapshots")
    rm.set_defaults(func=_rm)


def _list(args) -> int:
    from tpserve.model.snapshot import list_snapshots

    rows = list_snapshots(args.snapshot_dir)
    if not rows:
        print("no snapshots")
    for r in rows:
        key = r["key"]
        print(f"{r['id']}  {r['bytes'] / 2**20:10.1f} MiB  ranks {len(r['ranks'])}/{key.get('world', '?')}  "
              f"{key.get('quant', '?')}  {key.get('dtype', '?')}  {key.get('checkpoint', '?')}")
    return 0


def _rm(args) -> int:
    import shutil

    from tpserve.model.snapshot import list_snapshots

    rows = {r["id"] for r in list_snapshots(args.snapshot_dir)}
    ids = sorted(rows) if args.all else args.ids
    if not ids:
        raise ValueError("snapshot rm: name snapshot ids (see `tpserve snapshot list`) or pass --all")
    unknown = [i for i in ids if i not in rows]
    if unknown:
        raise ValueError(f"snapshot rm: no snapshot {unknown} (see `tpserve snapshot list`)")
    from tpserve.model.snapshot import SnapshotStore

    root = SnapshotStore(args.snapshot_dir).root
    for i in ids:
        shutil.rmtree(root / i)
        print(f"removed {i}")
    return 0
