"""The record behind the docs: every performance table and the results index are what
bench/tables.py generates from the committed JSON, every text report is the rendering of its JSON,
bench/results holds only the documented layout, and every study is cited. Reads files only: no GPU,
no extension needed."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import record, tables  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def report_jsons():
    return sorted(p for p in RESULTS.rglob("*.json") if "cases" in json.loads(p.read_text()))


def test_every_generated_block_and_the_index_match_the_json(capsys):
    rc = tables.main(["--check"])
    assert rc == 0, "docs differ from bench/results; run `python bench/tables.py`:\n" + capsys.readouterr().out


def test_a_typed_number_in_a_generated_block_is_caught():
    readme = ROOT / "README.md"
    text = readme.read_text()
    m = re.search(r"\| 132 us / 321 us \(4\.05 / 4\.18 TB/s\)", text)
    assert m, "the rmsnorm row of README.md's H200 table is not where this test expects it"
    typed = text.replace("4.05 / 4.18 TB/s", "4.05 / 4.19 TB/s", 1)
    assert tables.regenerate(typed, readme)[0] == text
    assert tables.regenerate(typed, readme)[0] != typed


@pytest.mark.parametrize("path", report_jsons(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_each_text_report_is_the_rendering_of_its_json(path):
    txt = path.with_suffix(".txt")
    assert txt.exists(), f"{txt.relative_to(ROOT)} is missing"
    assert txt.read_text() == record.render_report(record.load(path)) + "\n", (
        f"{txt.relative_to(ROOT)} is not the rendering of its JSON")


def test_results_hold_only_the_layout():
    allowed = [r"README\.md", r"[a-z0-9]+/[a-z0-9_]+\.(json|txt)", r"[a-z0-9]+/gpu_tests\.txt",
               r"[a-z0-9]+/studies/[A-Za-z0-9_.+-]+\.(json|txt|log|png)"]
    for p in RESULTS.rglob("*"):
        if p.is_file() and not p.name.startswith("."):
            rel = p.relative_to(RESULTS).as_posix()
            assert any(re.fullmatch(a, rel) for a in allowed), f"bench/results/{rel} is outside the layout"


def test_an_op_file_holds_that_op_only():
    for p in report_jsons():
        if "studies" in p.parts:
            continue
        ops = {c["op"] for c in record.load(p)["cases"]}
        assert ops == {p.stem}, f"{p.relative_to(ROOT)} holds {sorted(ops)}"


def test_every_study_is_cited_by_a_doc():
    cited = tables.citations()
    for p in RESULTS.glob("*/studies/*"):
        rel = p.relative_to(RESULTS).as_posix()
        assert cited.get(rel), f"bench/results/{rel} is cited by no doc: studies live only while cited"


def test_save_current_writes_one_pair_per_op(tmp_path):
    src = record.load(RESULTS / "h200" / "hc_split_sinkhorn.json")
    other = json.loads(json.dumps(src["cases"][0]))
    other["op"] = "mhc_post"
    run = {**src, "cases": src["cases"] + [other]}
    written = record.save_current(run, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "h200/hc_split_sinkhorn.json", "h200/hc_split_sinkhorn.txt", "h200/mhc_post.json",
        "h200/mhc_post.txt"]
    assert len(record.load(tmp_path / "h200" / "hc_split_sinkhorn.json")["cases"]) == len(src["cases"])
    assert record.save_study(run, "ab-test", tmp_path)[0] == tmp_path / "h200" / "studies" / "ab-test.json"
    with pytest.raises(ValueError):
        record.save_study(run, "../escape", tmp_path)


@pytest.mark.parametrize("name,folder", [("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
                                         ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA L40S", "l40")])
def test_device_folder(name, folder):
    assert record.device_folder({"device": "cuda:0", "device_info": {"name": name}}) == folder
    assert record.device_folder({"device": "cpu", "device_info": {"name": name}}) == "cpu"


def test_header_names_free_page_reporting_only_where_recorded():
    """A CPU run on a VM with free page reporting says so under its device line (its fresh-page
    costs vary with the host); runs without the field (older JSONs, GPUs) render as before."""
    meta = {"device": "cpu", "date": "d", "device_info": {"name": "x", "cores": 2, "torch_threads": 2}}
    plain = record.render_header(meta)
    assert not any("page reporting" in line for line in plain)
    meta["device_info"]["page_reporting_order"] = 11
    marked = record.render_header(meta)
    assert len(marked) > len(plain) and "free page reporting, order 11" in " ".join(marked)
    meta["device_info"]["page_reporting_order"] = None
    assert record.render_header(meta) == plain


def test_save_refuses_a_partial_run():
    from bench import report

    for extra in (["--quick"], ["--cases", "x"], ["--dtype", "fp32"]):
        assert report.main(["--save", *extra]) == 2


def test_the_repository_cites_only_its_own_documents(capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import cite_docs

    assert cite_docs.main(["--check"]) == 0, capsys.readouterr().out
    outside = re.compile(r"\.\./shared|/work/shared|\.library/")
    for p in cite_docs.tracked_text_files(outside.pattern):
        if p == Path(__file__).resolve():
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            assert not outside.search(line), f"{p.relative_to(ROOT)}:{i} cites a file outside the repo"
