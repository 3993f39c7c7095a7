"""The one printer of the bench scripts' results (issue 65).

Each script under bench/ printed its markdown, csv and json its own way: csv
lines broke on a comma in a name, json was a list in one script and a dict in
the next, a ratio line right under a table became one of its rows. A script
now fills a Table with raw values (one dict per row), says how markdown shows
each column, and prints with emit(args.format, table, ...); --format comes
from add_format_argument(parser):

  md    (default) the title, the table (cells formatted per column, `|`
        escaped, a missing value shown as "-"), then the notes (the ratio
        lines), a blank line between each;
  csv   per table, the header (the columns' keys) and the rows, raw values,
        quoted as the csv module does; title, notes and meta only in json;
  json  per table, one JSON object on a line of its own:
        {"title": str, "meta": {...}, "rows": [{key: raw value}], "summary": {...}}
        (rows keep every key they were given, shown or not; NaN and inf are
        null). One table is one JSON document; several are JSON lines.

Several tables print one after another, a blank line between them (md, csv);
a Table without columns is a title and notes alone. Standard library only;
a script, run as a file, imports it with
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
"""
import csv, io, json, math, sys

FORMATS = ("md", "csv", "json")


def add_format_argument(parser):
    """--format md|csv|json (default md) on an argparse parser."""
    parser.add_argument("--format", choices=FORMATS, default="md",
                        help="markdown table (default), csv rows, or one JSON object per table")


def ratio(x, base=None, digits=2):
    """'2.13x': x (or x / base), '-' where it is undefined (None, 0 base, NaN)."""
    try:
        r = x if base is None else x / base
    except (TypeError, ZeroDivisionError):
        return "-"
    return "-" if r is None or math.isnan(r) else "%.*fx" % (digits, r)


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _csv_value(v):
    if v is None:
        return ""
    return json.dumps(_finite(v)) if isinstance(v, (list, dict, bool)) else v


class Table:
    """columns: "key", or (key, header[, fmt[, align]]): fmt a %-format or a
    callable of the value, for markdown only; align "right" for `---:`;
    header None: a column of csv alone, not shown in markdown."""

    def __init__(self, columns=(), title="", meta=None, missing="-"):
        self.columns = [(c,) if isinstance(c, str) else tuple(c) for c in columns]
        self.title, self.meta, self.missing = title, dict(meta or {}), missing
        self.rows, self.md, self.notes, self.summary = [], [], [], {}

    def add(self, row=None, md=None, **values):
        """A row of raw values; md: {key: text} shown in markdown instead."""
        self.rows.append({**(row or {}), **values})
        self.md.append(md or {})
        return self

    def note(self, text, **summary):
        """A line under the markdown table; summary: its numbers, for json."""
        self.notes.append(text)
        self.summary.update(summary)
        return self

    def _cell(self, i, col):
        key, fmt = col[0], col[2] if len(col) > 2 else None
        v = self.rows[i].get(key)
        if key in self.md[i]:
            text = str(self.md[i][key])
        elif v is None:
            text = self.missing
        elif fmt is None:
            text = str(v)
        else:
            text = fmt(v) if callable(fmt) else fmt % v
        return text.replace("\n", " ").replace("|", "\\|")

    def markdown(self):
        blocks = [self.title] if self.title else []
        shown = [c for c in self.columns if len(c) == 1 or c[1] is not None]
        if shown:
            lines = ["| " + " | ".join(c[1] if len(c) > 1 else c[0] for c in shown) + " |",
                     "|" + "".join("---:|" if c[3:] == ("right",) else "---|" for c in shown)]
            lines += ["| " + " | ".join(self._cell(i, c) for c in shown) + " |" for i in range(len(self.rows))]
            blocks.append("\n".join(lines))
        if self.notes:
            blocks.append("\n".join(self.notes))
        return "\n\n".join(blocks)

    def csv(self):
        if not self.columns:
            return ""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow([c[0] for c in self.columns])
        for r in self.rows:
            w.writerow([_csv_value(r.get(c[0])) for c in self.columns])
        return out.getvalue().rstrip("\n")

    def json(self):
        return json.dumps(_finite({"title": self.title, "meta": self.meta, "rows": self.rows,
                                   "summary": self.summary}), default=str)

    def render(self, fmt):
        return {"md": self.markdown, "csv": self.csv, "json": self.json}[fmt]()


def record(values, title="", fmt=None, **kw):
    """One measurement per row: a "measure | value" table of a dict."""
    t = Table([("measure",), ("value", "value", fmt)], title=title, **kw)
    for k, v in values.items():
        t.add(measure=k, value=v)
    return t


def render(fmt, *tables):
    """The tables as one text: a blank line between them in md and csv."""
    parts = [t.render(fmt) for t in tables]
    return ("\n" if fmt == "json" else "\n\n").join(p for p in parts if p)


def emit(fmt, *tables, file=None):
    """Prints render(fmt, *tables), if it has anything to print."""
    text = render(fmt, *tables)
    if text:
        print(text, file=file or sys.stdout, flush=True)
