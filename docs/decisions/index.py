#!/usr/bin/env python3
"""Rewrite the index table of docs/decisions/README.md from the records.

Run from anywhere: python3 docs/decisions/index.py

Everything in README.md above the MARKER line (the preface) is kept; the
table, the gaps line and the pending line below it are regenerated.

Title: the record's first heading, without its "NNNN:" / "NNNN —" prefix.
Status: "accepted" unless
  - the record itself says "superseded by NNNN", "superseded in part by NNNN",
    "amended by NNNN" or "replaced by NNNN", or
  - a later record says "supersedes NNNN", "replaces decision NNNN",
    "amends NNNN" or "the rest of decision NNNN stands" (then the earlier
    one is "superseded by" / "amended by" the later one).
"""
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent
README = HERE / "README.md"
MARKER = "<!-- index.py: everything below this line is generated -->"

# A record about itself: "superseded by 0007", "amended by 0094", ...
SELF = re.compile(r"(superseded in part|superseded|amended|replaced) by (?:decision )?(\d{4})", re.I)
# A later record about an earlier one.
LATER = [
    (re.compile(r"\bsupersedes (?:decision )?(\d{4})", re.I), "superseded by"),
    (re.compile(r"\breplaces (?:decision )?(\d{4})", re.I), "superseded by"),
    (re.compile(r"\bamends (?:decision )?(\d{4})", re.I), "amended by"),
    (re.compile(r"\brest of decision (\d{4}) stands", re.I), "amended by"),
]

records = {}
for path in sorted(HERE.glob("[0-9][0-9][0-9][0-9]-*.md")):
    number = path.name[:4]
    text = path.read_text(encoding="utf-8")
    heading = next((l for l in text.splitlines() if l.startswith("# ")), "# " + path.stem)
    title = re.sub(r"^#\s*\d{4}\s*[:—-]\s*", "", heading).lstrip("# ").strip()
    records[number] = {"path": path.name, "title": title, "text": text, "status": []}

for number, r in records.items():
    for how, other in SELF.findall(r["text"]):
        if other != number:
            r["status"].append(f"{how.lower()} by {other}")
for number, r in records.items():
    for pattern, how in LATER:
        for earlier in pattern.findall(r["text"]):
            if earlier in records and earlier != number:
                records[earlier]["status"].append(f"{how} {number}")

lines = [MARKER, "", "| number | title | status | record |", "|---|---|---|---|"]
for number, r in records.items():
    status = "; ".join(dict.fromkeys(r["status"])) or "accepted"
    title = r["title"].replace("|", "\\|")
    lines.append(f"| {number} | {title} | {status} | [{r['path']}]({r['path']}) |")

numbers = sorted(int(n) for n in records)
gaps = [n for n in range(1, numbers[-1] + 1) if f"{n:04d}" not in records]
ranges = []
for n in gaps:
    if ranges and ranges[-1][1] == n - 1:
        ranges[-1][1] = n
    else:
        ranges.append([n, n])
text = ", ".join(f"{a:04d}" if a == b else f"{a:04d}–{b:04d}" for a, b in ranges)
lines += ["", f"Numbers with no record: {text or 'none'}."]

old = README.read_text(encoding="utf-8") if README.exists() else MARKER + "\n"
preface = old.split(MARKER)[0]
README.write_text(preface + "\n".join(lines) + "\n", encoding="utf-8")
print(f"{README}: {len(records)} records, gaps: {text or 'none'}")
