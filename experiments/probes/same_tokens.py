"""Do two `bench --json` runs give the same tokens? Every method of the first against every method of the second,
prompt by prompt (token_ids), e.g. a commit before a restructure against one after it.

    python experiments/probes/same_tokens.py BEFORE.json AFTER.json
"""
import argparse
import json


def token_ids(path: str) -> dict[str, dict]:
    by_method: dict[str, dict] = {}
    for row in json.load(open(path))["rows"]:
        by_method.setdefault(row["method"], {})[row["id"]] = row["token_ids"]
    return by_method


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    args = ap.parse_args()
    first, second = token_ids(args.first), token_ids(args.second)
    print(f"# {args.first} against {args.second}")
    for m1, rows1 in first.items():
        for m2, rows2 in second.items():
            shared = sorted(set(rows1) & set(rows2))
            same = sum(rows1[i] == rows2[i] for i in shared)
            print(f"{m1:24s} {m2:24s} {same}/{len(shared)} prompts identical")


if __name__ == "__main__":
    main()
