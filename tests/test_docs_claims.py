"""No document orders mixers on fewer than five seeds.

A sentence of README.md, docs/findings.md or docs/reproductions.md that ranks mixers (an ordering
word beside two mixer names, or five or more mixers listed with their numbers in sorted order)
must carry a marker naming the experiment it ranks from, `<!-- ranks: capacity -->`, and that
experiment's sweep must run at least five seeds (its `seed:` sweeper parameter in
harness/conf/experiment/<name>.yaml; none means the one default seed). The same holds for a table
with a row per mixer sorted by a column (the marker goes in its header row). A one-seed experiment
illustrates: its text gives each mixer's numbers in a fixed order and names no order among them.
In reproductions tables the `claim` and `anchor` columns state what a paper found and are not
read.

A sentence of docs/findings.md or docs/reproductions.md that orders two mixers (in each clause,
the mixer named last before its ordering word against those named after it) and cites a CSV (`capacity_n50.csv`, in
the sentence or else in its paragraph, list item or table row) must find the two apart in that
CSV: at some point the two share (the same values in the columns before `n`, where the figures'
tables keep a point's settings), their intervals (`low`, `high`) must not overlap. A mixer
followed by a number in the sentence is held to the rows whose mean reads as that number. The
CSV is the one the figures command wrote for the marker's profile: docs/figures/<name> for a
quick experiment, docs/figures/findings/<name> for `ranks: findings/<experiment>`."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/findings.md", "docs/reproductions.md")
CITING_DOCS = ("docs/findings.md", "docs/reproductions.md")  # whose orderings are held to the CSVs they cite
FIGURES = ROOT / "docs" / "figures"
EXPERIMENTS = ROOT / "harness" / "conf" / "experiment"
MODELS = ROOT / "harness" / "conf" / "model"
MIN_SEEDS = 5  # the spec's floor for ranking mixers (and for an interval)
SORTED_RUN = 5  # this many mixers in a row with strictly sorted numbers read as a ranking; shorter
# runs turn up by chance in a list kept in a fixed order

MARKER = re.compile(r"<!--\s*ranks:\s*([\w/.-]+)\s*-->")
COMMENT = re.compile(r"<!--.*?-->", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
LIST_ITEM = re.compile(r"([-*+]|\d+\.)\s")
LEADING_NUMBER = re.compile(r"\s*[(\[]?(\d+(?:,\d{3})*(?:\.\d+)?)")
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")
ORDER = re.compile(
    r"\b(?:beats?|beaten|ahead of|outperform\w*|best|worst|better|worse|higher|lower|highest|"
    r"lowest|above|below|than|ranks|ranked|ranking|order(?:s|ed|ing)?|sharpest|weakest|strongest|"
    r"exceeds?|overtakes?|trails?|surpass\w*|separates? (?:\w+ )?from)\b|(?<=\s)[<>](?=\s)",
    re.I,
)
# Prose names of the built-in mixers, beside their config names (which are found on their own).
ALIASES = {
    "gated_deltanet": ("gated deltanet",),
    "deltanet_additive": ("additive control", "its control"),
    "deltanet": ("delta rule", "delta-rule"),
    "swa": ("sliding window", "sliding-window", "the window"),
    "linear": ("identity map", "linear attention"),
    "elu": ("elu+1",),
    "favor": ("favor+", "performer"),
    "mamba": ("mamba-2",),
}


@lru_cache(maxsize=None)
def mixer_pattern() -> tuple[re.Pattern, dict[str, str]]:
    """One regex over every mixer's config name and prose alias (longest first, so 'gated_deltanet' is not read
    as 'deltanet'); a name inside a dotted path or an identifier is not a mention."""
    canonical = {p.stem: p.stem for p in MODELS.glob("*.yaml")}  # every `model=` a user can name
    canonical |= {alias: name for name, aliases in ALIASES.items() for alias in aliases}
    words = sorted(canonical, key=len, reverse=True)
    body = "|".join(re.escape(w) for w in words)
    return re.compile(rf"(?<![\w./])(?:{body})(?![\w/])(?!\.\w)", re.I), {k.lower(): v for k, v in canonical.items()}


@lru_cache(maxsize=None)
def seeds(experiment: str) -> int:
    """How many seeds the experiment's sweep runs (its `seed:` sweeper parameter, default one)."""
    path = EXPERIMENTS / f"{experiment}.yaml"
    if not path.is_file():
        raise AssertionError(f"a ranks marker names {experiment!r}, which is no file under {EXPERIMENTS}")
    params = ((yaml.safe_load(path.read_text()).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    if "seed" not in params:
        return 1
    override = OverridesParser.create().parse_override(f"seed={params['seed']}")
    return len(list(override.sweep_iterator())) if override.is_sweep_override() else 1


def cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def blocks(text: str) -> tuple[list[str], list[list[str]]]:
    """A markdown document as its paragraphs and list items (code blocks and headings left out)
    and its tables (each a list of lines: header, separator, rows)."""
    paras: list[str] = []
    tables: list[list[str]] = []
    para: list[str] = []
    in_table = False
    for line in FENCE.sub("", text).splitlines() + [""]:
        s = line.strip()
        if s.startswith("|"):
            if para:
                paras.append(" ".join(para))
                para = []
            if not in_table:
                tables.append([])
            tables[-1].append(s)
            in_table = True
            continue
        in_table = False
        if not s or s.startswith("#") or LIST_ITEM.match(s):
            if para:
                paras.append(" ".join(para))
            para = [s] if LIST_ITEM.match(s) else []
        else:
            para.append(s)
    return paras, tables


def units(text: str) -> list[str]:
    """The sentences of a markdown document: paragraphs, list items and table rows split at
    sentence ends, images left out; in a table each cell ends a sentence, and the cells under a
    `claim` or `anchor` header (what a paper says) are dropped."""
    return [sentence for _, sentence in sentences(text)]


def sentences(text: str) -> list[tuple[str, str]]:
    """(block, sentence) for every sentence of ``units``: the paragraph, list item or table row it
    stands in beside it."""
    paras, tables = blocks(text)
    for table in tables:
        header = [c.lower() for c in cells(table[0])]
        for row in table[2:]:
            kept = [c.rstrip(".") for h, c in zip(header, cells(row)) if not h.startswith(("claim", "anchor"))]
            paras.append(". ".join(kept))
    out = []
    for block in paras:
        block = LINK_TARGET.sub("]", IMAGE.sub("", block))
        out += [(block, u) for u in SENTENCE_END.split(block) if u.strip()]
    return out


def mixers_in(sentence: str) -> list[tuple[int, str]]:
    pattern, canonical = mixer_pattern()
    return [(m.start(), canonical[m.group(0).lower()]) for m in pattern.finditer(sentence)]


def longest_sorted_run(values: list[float | None]) -> int:
    """The most consecutive values strictly sorted either way (a tie or None breaks a run: a tie
    orders nothing)."""
    best = run_up = run_down = 0
    previous = None
    for v in values:
        if v is None or previous is None:
            run_up = run_down = 0 if v is None else 1
        else:
            run_up, run_down = (run_up + 1 if v > previous else 1), (run_down + 1 if v < previous else 1)
        best, previous = max(best, run_up, run_down), v
    return best


def sorted_run(sentence: str, mentions: list[tuple[int, str]]) -> int:
    """The longest run of mixers listed with numbers in sorted order (either way): each number
    goes to the mixers named since the number before it ('softmax and mamba 0.986')."""
    values: list[float | None] = []
    pending = False
    events = sorted([(pos, "m") for pos, _ in mentions]
                    + [(m.start(), m.group(0)) for m in NUMBER.finditer(sentence)])
    for _, what in events:
        if what == "m":
            pending = True
        elif pending:
            values.append(float(what.replace(",", "")))
            pending = False
    return longest_sorted_run(values)


def marker_problem(text: str) -> str | None:
    for name in MARKER.findall(text):
        if seeds(name) < MIN_SEEDS:
            return f"marked as ranking from {name!r}, which runs {seeds(name)} seed(s) (< {MIN_SEEDS})"
    return None


def table_problem(table: list[str]) -> str | None:
    """A table with a row per mixer sorted by one of its columns (five mixers or more): a ranking
    unless its header carries the marker of a five-seed experiment. A table in a fixed order of
    mixers is sorted by a column only by chance."""
    if MARKER.search(table[0]):
        return marker_problem(table[0])
    header = cells(table[0])
    rows = [r for r in map(cells, table[2:]) if len({name for _, name in mixers_in(r[0])}) == 1]
    for col in range(1, len(header)):
        values = [float(m.group(1).replace(",", "")) for r in rows
                  if col < len(r) and (m := LEADING_NUMBER.match(r[col]))]
        if len(values) >= SORTED_RUN and len(set(values)) > 1 and values in (sorted(values), sorted(values)[::-1]):
            return f"column {header[col]!r} sorts its {len(values)} mixers with no ranks marker in its header"
    return None


def ranking_problem(sentence: str) -> str | None:
    """Why the sentence may not ship, or None: it ranks mixers without a marker of a five-seed
    experiment, or it carries a marker of one with fewer seeds."""
    if MARKER.search(sentence):
        return marker_problem(sentence)
    plain = COMMENT.sub("", sentence).replace("`", "")
    mentions = mixers_in(plain)
    distinct = {name for _, name in mentions}
    if len(distinct) >= 2 and (hit := ORDER.search(plain)):
        return f"orders mixers ({hit.group(0)!r} beside {', '.join(sorted(distinct))}) with no ranks marker"
    if len(distinct) >= 2 and sorted_run(plain, mentions) >= SORTED_RUN:
        return f"lists {SORTED_RUN}+ mixers in sorted order with no ranks marker"
    return None


def problems(text: str) -> list[str]:
    found = [f"{why}: {u.strip()[:160]}" for u in units(text) if (why := ranking_problem(u))]
    return found + [f"{why}: {t[0][:160]}" for t in blocks(text)[1] if (why := table_problem(t))]


CSV_NAME = re.compile(r"(?<![\w/.-])([\w-]+\.csv)\b")
STAT_COLUMNS = {"n", "mean", "low", "high", "interval_method"}


def cited_csvs(block: str, sentence: str) -> list[str]:
    """The CSV file names a sentence cites, else those its block cites."""
    return list(dict.fromkeys(CSV_NAME.findall(sentence))) or list(dict.fromkeys(CSV_NAME.findall(block)))


BOUND = re.compile(r"\b(?:lower|upper) bounds?\b", re.I)  # a kind of number, not an order
CLAUSE_END = re.compile(r"[;:]")


def ordered_pairs(sentence: str) -> list[tuple[str, str]]:
    """The pairs of mixers a sentence orders, clause by clause (split at ';' and ':'): the mixer
    named last before the clause's first ordering word against each named after it ('favor_m8
    falls below elu at N = 2, below favor_m16 at 4': favor_m8 against elu and favor_m16)."""
    plain = BOUND.sub("bound", COMMENT.sub("", sentence).replace("`", ""))
    pairs = []
    for clause in CLAUSE_END.split(plain):
        hit = ORDER.search(clause)
        mentions = mixers_in(clause)
        before = [name for pos, name in mentions if hit is not None and pos < hit.start()]
        if not before:
            continue
        pairs += [(before[-1], name) for pos, name in mentions if pos >= hit.end() and name != before[-1]]
    return list(dict.fromkeys(pairs))


def quoted_numbers(sentence: str) -> dict[str, list[str]]:
    """{mixer: the numbers quoted right after it, before the next mixer} ('favor (0.78) above dpfp
    (0.53)': favor 0.78, dpfp 0.53); a number only its first, as written."""
    plain = COMMENT.sub("", sentence).replace("`", "")
    mentions = mixers_in(plain)
    out: dict[str, list[str]] = {}
    for i, (pos, name) in enumerate(mentions):
        end = mentions[i + 1][0] if i + 1 < len(mentions) else len(plain)
        number = NUMBER.search(plain, pos + len(name), min(end, pos + len(name) + 40))
        if number:
            out.setdefault(name, []).append(number.group(0).replace(",", ""))
    return out


def canonical(label) -> str:
    """A CSV's label as a model choice: 'deltanet additive' -> deltanet_additive, 'favor m=16' ->
    favor_m16."""
    return str(label).lower().replace("ν", "nu").replace("=", "").replace(" ", "_")


def mixer_rows(frame: pd.DataFrame, mixer: str, numbers: list[str]) -> pd.DataFrame:
    """The rows of ``mixer`` (its label, else its model, read as a model choice), held to the
    rows whose mean reads as one of the numbers quoted after it where any does."""
    column = "label" if "label" in frame.columns else "model"
    rows = frame[frame[column].map(canonical) == mixer]
    if numbers and "mean" in rows.columns:
        pinned = rows[rows["mean"].map(lambda v: reads_as(v, numbers))]
        if len(pinned):
            return pinned
    return rows


def reads_as(value, numbers: list[str]) -> bool:
    """Whether a number reads as one of the quoted ones, at the precision each is quoted to."""
    value = pd.to_numeric(value, errors="coerce")
    return any(abs(value - float(q)) <= 0.5 * 10 ** -(len(q.split(".")[1]) if "." in q else 0) for q in numbers)


def overlap_in(frame: pd.DataFrame, a: str, b: str, numbers: dict[str, list[str]]) -> bool:
    """Whether the intervals of ``a`` and ``b`` overlap at every point they share in ``frame``
    (False where they share none with intervals: nothing to hold the sentence to). A ranking
    table (analysis.stats.ranking: a row per pair with `separated`) answers it directly."""
    if {"a", "b", "separated"} <= set(frame.columns):
        return ranked_apart(frame, a, b, numbers) is False
    if not ({"low", "high", "n"} <= set(frame.columns) and ({"label", "model"} & set(frame.columns))):
        return False
    keys = [c for c in frame.columns[:list(frame.columns).index("n")] if c not in ("label", "model")]
    rows_a, rows_b = mixer_rows(frame, a, numbers.get(a, [])), mixer_rows(frame, b, numbers.get(b, []))
    both = rows_a.merge(rows_b, on=keys, suffixes=("_a", "_b")) if keys else rows_a.merge(rows_b, how="cross",
                                                                                          suffixes=("_a", "_b"))
    both = both.dropna(subset=["low_a", "high_a", "low_b", "high_b"])
    if both.empty:
        return False
    apart = (both["high_a"] < both["low_b"]) | (both["high_b"] < both["low_a"])
    return not apart.any()


def ranked_apart(frame: pd.DataFrame, a: str, b: str, numbers: dict[str, list[str]]) -> bool | None:
    """In a ranking table, whether some row of the pair says its intervals separate (None: the
    pair has no row); rows whose means read as the numbers quoted for the two, where any do."""
    pair = []
    for first, second in ((a, b), (b, a)):
        rows = frame[(frame["a"].map(canonical) == first) & (frame["b"].map(canonical) == second)]
        for side, name in (("a", first), ("b", second)):
            quoted, mean = numbers.get(name, []), f"mean_{side}"
            if quoted and mean in rows.columns and rows[mean].map(lambda v, q=quoted: reads_as(v, q)).any():
                rows = rows[rows[mean].map(lambda v, q=quoted: reads_as(v, q))]
        pair.append(rows)
    rows = pd.concat(pair)
    if rows.empty:
        return None
    return bool(rows["separated"].astype(str).str.lower().isin(["true", "1"]).any())


def csv_folder(marker: str) -> Path:
    """Where the figures command wrote the CSVs of a marker's experiment: docs/figures for the
    quick profile, docs/figures/<profile> for another (`ranks: findings/lr_window`)."""
    profile = marker.split("/")[0] if "/" in marker else ""
    return FIGURES / profile if profile else FIGURES


def overlap_problem(block: str, sentence: str, figures: Path | None = None) -> str | None:
    """Why an ordering sentence is not borne out by the CSV it cites, or None."""
    markers = MARKER.findall(sentence)
    pairs = ordered_pairs(sentence)
    if not markers or not pairs:
        return None
    folder = figures if figures is not None else csv_folder(markers[0])
    numbers = quoted_numbers(sentence)
    for name in cited_csvs(block, sentence):
        path = folder / name
        if not path.is_file():
            continue
        frame = pd.read_csv(path)
        for a, b in pairs:
            if overlap_in(frame, a, b, numbers):
                return f"orders {a} and {b}, whose intervals overlap at every point they share in {name}"
    return None


@pytest.mark.parametrize("doc", CITING_DOCS)
def test_no_sentence_orders_two_mixers_whose_intervals_overlap_in_the_csv_it_cites(doc):
    text = (ROOT / doc).read_text()
    found = [f"{why}: {s.strip()[:160]}" for block, s in sentences(text) if (why := overlap_problem(block, s))]
    assert not found, f"{doc}: {len(found)} sentence(s) order mixers their CSV does not separate:\n" + "\n".join(found)


OVERLAP_CSV = """label,key,n,mean,interval_method,low,high,seed_0
deltanet,overwritten,5,0.67,t,0.61,0.80,0.7
deltanet_additive,overwritten,5,0.32,t,0.25,0.36,0.3
gated_deltanet,overwritten,5,0.63,t,0.54,0.79,0.6
gated_deltanet_additive,overwritten,5,0.60,t,0.39,0.67,0.6
"""


def test_the_overlap_check_catches_an_order_the_cited_csv_does_not_bear(tmp_path):
    (tmp_path / "reassignment.csv").write_text(OVERLAP_CSV)
    doc = ("<!-- ranks: reassignment --> gated_deltanet (0.63) lies above gated_deltanet_additive (0.60) "
           "on overwritten keys (`reassignment.csv`).")
    assert "whose intervals overlap" in overlap_problem(doc, doc, tmp_path)
    separated = doc.replace("gated_deltanet (0.63)", "deltanet (0.67)").replace(
        "gated_deltanet_additive (0.60)", "deltanet_additive (0.32)")
    assert overlap_problem(separated, separated, tmp_path) is None
    # the citation may stand in the sentence's paragraph; a CSV that is not there holds nothing
    block = doc.replace(" (`reassignment.csv`)", "") + " The means are in `reassignment.csv`."
    assert overlap_problem(block, block.split(" The means")[0], tmp_path) is not None
    assert overlap_problem(doc.replace("reassignment.csv", "absent.csv"), doc.replace("reassignment.csv", "absent.csv"),
                           tmp_path) is None
    # a quoted number holds a mixer to its row: deltanet's 0.67 lies apart from the additive control's 0.32
    mixed = ("<!-- ranks: reassignment --> deltanet (0.67) lies above gated_deltanet_additive (0.60) "
             "(`reassignment.csv`).")
    assert "overlap" in overlap_problem(mixed, mixed, tmp_path)  # [0.61, 0.80] and [0.39, 0.67] overlap


RANKING_CSV = """metric,a,b,mean_a,mean_b,n_a,n_b,separated,verdict
monotonicity,favor,dpfp,0.78,0.53,5,5,True,favor above dpfp
monotonicity,taylor,elu,0.45,0.41,5,5,False,not separated (intervals overlap)
entropy,taylor,elu,0.48,0.60,5,5,True,elu above taylor
"""


def test_a_ranking_csv_answers_for_its_pairs(tmp_path):
    (tmp_path / "sharpness_ranking.csv").write_text(RANKING_CSV)
    apart = "<!-- ranks: sharpness --> favor (0.78) lies above dpfp (0.53) (`sharpness_ranking.csv`)."
    assert overlap_problem(apart, apart, tmp_path) is None
    # taylor and elu separate on entropy only; their monotonicity (0.45, 0.41) does not
    close = "<!-- ranks: sharpness --> taylor (0.45) lies above elu (0.41) in `sharpness_ranking.csv`."
    assert "overlap" in overlap_problem(close, close, tmp_path)
    assert overlap_problem(close.replace("0.45", "0.48").replace("0.41", "0.60"),
                           close.replace("0.45", "0.48").replace("0.41", "0.60"), tmp_path) is None


def test_orders_are_read_across_the_ordering_word_and_csvs_by_profile():
    assert ordered_pairs("<!-- ranks: x --> favor lies above dpfp and taylor.") == [("favor", "dpfp"),
                                                                                  ("favor", "taylor")]
    assert ordered_pairs("elu and favor both learn.") == []
    assert ordered_pairs("deltanet's lower bounds left out: favor_m8 falls below elu; taylor is above dpfp.") == [
        ("favor_m8", "elu"), ("taylor", "dpfp")]
    assert quoted_numbers("favor (0.78) lies above dpfp (0.53)") == {"favor": ["0.78"], "dpfp": ["0.53"]}
    assert csv_folder("capacity") == FIGURES and csv_folder("findings/lr_window") == FIGURES / "findings"


@pytest.mark.parametrize("doc", DOCS)
def test_no_sentence_ranks_mixers_on_fewer_than_five_seeds(doc):
    found = problems((ROOT / doc).read_text())
    assert not found, f"{doc}: {len(found)} sentence(s) rank mixers without five seeds behind them:\n" + "\n".join(found)


def test_every_marker_names_a_five_seed_experiment():
    for doc in DOCS:
        for name in MARKER.findall((ROOT / doc).read_text()):
            assert seeds(name) >= MIN_SEEDS, f"{doc}: <!-- ranks: {name} --> but {name} runs {seeds(name)} seed(s)"


@pytest.mark.parametrize("sentence", [
    # orderings the README once drew from one-seed sweeps (MQAR, frontier, length, sharpness)
    "At d_model 64: taylor 0.997, deltanet 0.990, gated_deltanet 0.989, softmax and mamba 0.986, dpfp 0.965.",
    "the delta-rule layer separates from plain linear attention (0.82 against 0.67) but not from its control.",
    "At 64 / 1,024 tokens: softmax 1.00 / 0.98, taylor 0.99 / 0.77, elu 0.95 / 0.62, linear 0.89 / 0.68, dpfp 0.84 / 0.59.",
    "Then the window (0.21), FAVOR+ (0.34), dpfp (0.37), taylor (0.48) and elu (0.60).",
    "on the capacity task it recalls more than elu and less than Taylor.",
    "FAVOR+ is the weakest mixer and falls below elu.",
    "<!-- ranks: mqar --> softmax beats elu at d_model 64.",
])
def test_a_ranking_without_five_seeds_is_caught(sentence):
    assert ranking_problem(sentence) is not None


@pytest.mark.parametrize("sentence", [
    "<!-- ranks: capacity --> At N = 24 softmax 1.00 holds above taylor 0.92, dpfp 0.57 and elu 0.33.",
    "| `gated_deltanet` | the delta rule behind Mamba-2's scalar decay | d·d |",
    "softmax 0.986 at d_model 64 (one seed).",
    "Each mixer's numbers at d_model 64: softmax 0.986, swa 0.833, linear 0.146, elu 0.936, favor 0.845.",
    "the decay of `harness.layers.mamba.init_scalar_decay` sets deltanet's dt higher than before.",
])
def test_an_illustration_or_a_five_seed_ranking_passes(sentence):
    assert ranking_problem(sentence) is None, ranking_problem(sentence)


SORTED_TABLE = """
| mixer | d_model 64 |
|---|---:|
| taylor | 0.997 |
| deltanet | 0.990 |
| softmax | 0.986 |
| dpfp | 0.965 |
| elu | 0.936 \\| one seed |
"""


def test_a_table_sorted_by_a_one_seed_column_is_caught():
    assert any("sorts" in p for p in problems(SORTED_TABLE))
    assert any("'mqar'" in p for p in problems(SORTED_TABLE.replace("| mixer |", "| mixer <!-- ranks: mqar --> |")))
    assert not problems(SORTED_TABLE.replace("| mixer |", "| mixer <!-- ranks: capacity --> |"))
    unsorted = SORTED_TABLE.replace("| softmax | 0.986 |", "| softmax | 0.240 |")
    assert not problems(unsorted)


def test_seed_counts_are_read_from_the_sweeps():
    assert seeds("capacity") >= MIN_SEEDS
    assert seeds("mqar") == 1 and seeds("needle") == 1  # `seed: 0`, and no seed parameter at all
    with pytest.raises(AssertionError, match="no file"):
        seeds("no_such_experiment")
