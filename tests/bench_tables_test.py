#!/usr/bin/env python3
"""cpu_bench_tables: the benchmark table scripts (bench/step_time_table.py, bench/overhead_table.py,
bench/overhead_steps.py, bench/precision_compare.py, bench/precision_noise_table.py, bench/settings_compare.py,
bench/eval_invariance_table.py, bench/layer_kernels.py, bench/ncu_step_table.py) and scripts/render_docs.py's
precision region on
small JSON-lines files written here: precisions are keys of their own, lines without one read as
fp32 (step_time's former tf32 modes as tf32), and the ratios per model and precision are the ones
the numbers give. Standard library only (unittest)."""
import csv
import io
import json
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "peers"))
sys.path.insert(0, str(ROOT / "scripts"))

import eval_invariance_table  # noqa: E402
import free_det_table  # noqa: E402
import layer_kernels  # noqa: E402
import ncu_step_table  # noqa: E402
import overhead_steps  # noqa: E402
import overhead_table  # noqa: E402
import peer_common  # noqa: E402
import precision_compare  # noqa: E402
import precision_noise_table  # noqa: E402
import render_docs  # noqa: E402
import settings_compare  # noqa: E402
import step_time_table  # noqa: E402

MIB = 2**20
GPU = "NVIDIA H100 80GB HBM3"


def step_line(tool, mode, graph, ms, precision=None, peak_mib=None, model="resnet18", **extra):
    """A step_time (or torch_step_time) line; precision None writes none, as files before precisions."""
    rec = {"tool": tool, "model": model, "mode": mode, "graph": graph, "batch": 128, "steps": 100,
           "ms_median": ms, "ms_p10": ms * 0.9, "ms_p90": ms * 1.1, "ms_wall": ms, "gpu": GPU}
    if precision is not None:
        rec["precision"] = precision
    if peak_mib is not None:
        rec["peak_mem_bytes"] = int(peak_mib * MIB)
    if tool == "ditto":
        rec["flops_per_step"] = 1e11
    rec.update(extra)
    return rec


def zoo_line(tool, mode, ms, precision=None, peak_mib=None, model="resnet50", **extra):
    rec = {"tool": tool, "model": model, "mode": mode, "batch": 64, "image_size": 224, "steps": 10,
           "ms_median": ms, "ms_p10": ms, "ms_p90": ms, "gpu": GPU}
    if precision is not None:
        rec["precision"] = precision
    if peak_mib is not None:
        rec["peak_mem_bytes"] = int(peak_mib * MIB)
    rec.update(extra)
    return rec


class Files:
    """JSON-lines files in a temporary folder."""

    def __init__(self, test):
        self.dir = tempfile.TemporaryDirectory()
        test.addCleanup(self.dir.cleanup)
        self.path = Path(self.dir.name)

    def write(self, name, records):
        path = self.path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path


TORCH_FP16_SCALE = "dynamic: torch.amp.GradScaler('cuda', init_scale 65536)"


def step_fixture(files):
    ditto = [
        # Written before precisions: no precision field, no peak memory.
        step_line("ditto", "deterministic", False, 21.0),
        step_line("ditto", "fastest", False, 12.0),
        step_line("ditto", "tf32", False, 8.5),
        step_line("ditto", "deterministic", False, 9.0, "bf16", 150),  # replaced below: the last line wins
        step_line("ditto", "deterministic", False, 4.0, "bf16", 100),
        step_line("ditto", "deterministic", True, 3.6, "bf16", 40),
        step_line("ditto", "fastest", False, 3.2, "bf16", 120),
        step_line("ditto", "fastest", True, 3.0, "bf16", 50),
        step_line("ditto", "deterministic", False, 4.4, "fp16", 110, loss_scale="none"),
        step_line("ditto", "fastest", False, 4.0, "fp16", 130, loss_scale="none"),
    ]
    torch = [
        step_line("pytorch", "default", False, 17.5),
        step_line("pytorch", "tf32", False, 9.0),
        step_line("pytorch", "default", False, 5.0, "bf16", 200),
        step_line("pytorch", "default", True, 4.5, "bf16", 30),
        step_line("pytorch", "default", False, 5.5, "fp16", 220, loss_scale=TORCH_FP16_SCALE),
    ]
    return files.write("step_time.jsonl", ditto), files.write("torch_step_time.jsonl", torch)


def zoo_fixture(files):
    ditto = [
        zoo_line("ditto", "heuristic", 160.0),
        zoo_line("ditto", "fastest", 130.0),
        zoo_line("ditto", "deterministic", 170.0, peak_mib=11000),
        zoo_line("ditto", "heuristic", 70.0, "bf16"),
        zoo_line("ditto", "fastest", 60.0, "bf16"),
        zoo_line("ditto", "deterministic", 66.0, "bf16", 6000),
    ]
    torch = [
        zoo_line("pytorch", "default", 150.0, peak_mib=11500),
        zoo_line("pytorch", "deterministic", 175.0, peak_mib=11600),
        zoo_line("pytorch", "default", 55.0, "bf16", 8000),
        zoo_line("pytorch", "benchmark", 50.0, "bf16", 8100),
        zoo_line("pytorch", "deterministic", 75.0, "bf16", 8200),
    ]
    return files.write("overhead.jsonl", ditto), files.write("torch_overhead.jsonl", torch)


def load_quietly(load, paths):
    with redirect_stderr(io.StringIO()):  # the replaced line is reported on stderr
        return load(paths)


class PrecisionOf(unittest.TestCase):
    def test_field_wins_and_old_lines_read_as_fp32(self):
        self.assertEqual(precision_compare.precision_of({"mode": "heuristic", "precision": "bf16"}), "bf16")
        self.assertEqual(precision_compare.precision_of({"mode": "deterministic"}), "fp32")
        self.assertEqual(precision_compare.precision_of({"mode": "default", "precision": None}), "fp32")

    def test_former_tf32_modes_read_as_tf32(self):
        self.assertEqual(precision_compare.precision_of({"mode": "tf32"}), "tf32")
        self.assertEqual(precision_compare.precision_of({"mode": "tf32-deterministic"}), "tf32")

    def test_order(self):
        names = ["fp16", "other", "fp32", "bf16", "tf32"]
        self.assertEqual(sorted(names, key=precision_compare.precision_rank), ["fp32", "tf32", "bf16", "fp16", "other"])


class StepTimeTable(unittest.TestCase):
    def setUp(self):
        self.files = Files(self)
        self.paths = step_fixture(self.files)
        self.data = step_time_table.Data(load_quietly(step_time_table.load, list(self.paths)))

    def test_precisions_are_keys_of_their_own(self):
        d = self.data
        self.assertEqual(d.ms("ditto", "resnet18", "deterministic", False), 21.0)  # the old line, as fp32
        self.assertEqual(d.ms("ditto", "resnet18", "deterministic", False, "bf16"), 4.0)  # the last bf16 line
        self.assertEqual(d.ms("ditto", "resnet18", "tf32", False, "tf32"), 8.5)
        self.assertIsNone(d.ms("ditto", "resnet18", "tf32", False))
        self.assertEqual(d.best("ditto", "resnet18", "deterministic", "bf16"), (3.6, True))
        self.assertEqual(d.precisions("resnet18"), ["fp32", "tf32", "bf16", "fp16"])
        self.assertIsNone(d.peak("ditto", "resnet18", "deterministic", False))  # old lines have none
        self.assertEqual(d.peak("pytorch", "resnet18", "default", False, "bf16"), 200 * MIB)

    def test_precision_rows(self):
        rows = {(r.precision, r.setting): r for r in step_time_table.precision_rows(self.data)}
        self.assertEqual(set(rows), {("fp32", "eager"), ("bf16", "eager"), ("bf16", "graphed"), ("fp16", "eager")})
        bf16 = rows[("bf16", "eager")]
        self.assertEqual(bf16.cells(lambda v: f"{v:.3f}"),
                         ["resnet18", "bf16", "eager", "4.000", "3.200", "1.25×", "5.000", "0.80×", "100", "200",
                          "0.50×"])
        graphed = rows[("bf16", "graphed")]
        self.assertEqual((graphed.det, graphed.fastest, graphed.torch_default), (3.6, 3.0, 4.5))
        self.assertEqual((graphed.det_peak, graphed.torch_peak), (None, None))  # graphed memory is not compared
        fp32 = rows[("fp32", "eager")]
        self.assertAlmostEqual(precision_compare.ratio(fp32.det, fp32.torch_default), 1.2)

    def test_report(self):
        class Args:
            peak_fp32 = peak_tf32 = peak_half = None
        text = step_time_table.report(self.data, Args(), [str(p) for p in self.paths])
        self.assertIn("| precision | tool | mode | eager ms (median) | graphed ms (median) | graph speedup | "
                      "peak MiB (eager) |", text)
        self.assertIn("| bf16 | ditto | deterministic | 4.000 | 3.600 | 1.11× | 100.0 |", text)
        self.assertIn("| tf32 | ditto | tf32 | 8.500 | — | — | — |", text)
        self.assertIn("| resnet18 | bf16 | eager | 4.000 | 3.200 | 1.25× | 5.000 | 0.80× | 100 | 200 | 0.50× |", text)
        self.assertIn(f"fp16 loss scaling: ditto: none; pytorch: {TORCH_FP16_SCALE}.", text)
        # The roofline takes each row's precision's peak: 100 GFLOP in 4 ms is 25 TFLOP/s of BF16's 989.4.
        self.assertIn("| ditto | resnet18 | bf16 | deterministic | eager | 100.000 | 4.000 | 25.00 | 989.4 (bf16) | 2.5% |",
                      text)
        self.assertIn("| ditto | resnet18 | tf32 | tf32 | eager | 100.000 | 8.500 | 11.76 | 494.7 (tf32) | 2.4% |", text)

    def test_command_line_and_csv(self):
        out, table = self.files.path / "step_time.md", self.files.path / "step_time.csv"
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "step_time_table.py"), *map(str, self.paths),
                              "--out", str(out), "--csv", str(table)], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("repeats ('ditto', 'resnet18', 'deterministic', False, 'bf16')", run.stderr)
        with table.open() as f:
            rows = list(csv.DictReader(f))
        self.assertIn("precision", rows[0])
        bf16 = [r for r in rows if (r["tool"], r["mode"], r["precision"], r["graph"]) ==
                ("ditto", "deterministic", "bf16", "false")]
        self.assertEqual([(r["ms_median"], r["peak_mem_bytes"]) for r in bf16], [("4.0", repr(float(100 * MIB)))])
        self.assertIn("## Precisions", out.read_text())


class OverheadTable(unittest.TestCase):
    def setUp(self):
        self.files = Files(self)
        self.paths = zoo_fixture(self.files)
        self.records = overhead_table.load(list(self.paths))
        self.models = overhead_table.models_of(self.records)

    def test_keys_and_accessors(self):
        r = self.records
        self.assertEqual(overhead_table.ms(r, "ditto", "resnet50", "deterministic"), 170.0)
        self.assertEqual(overhead_table.ms(r, "ditto", "resnet50", "deterministic", "bf16"), 66.0)
        self.assertEqual(overhead_table.model_precisions(r, self.models), [("resnet50", "fp32"), ("resnet50", "bf16")])

    def test_main_table_ratios_stay_in_their_precision(self):
        lines = overhead_table.main_table(self.records, self.models)
        row = next(line for line in lines if line.startswith("| resnet50 | bf16 |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        # heuristic, fastest, det, det-tuned, nondet; det ÷ heur, det ÷ fastest, tuned ÷ fastest; torch default,
        # torch det, torch det ÷ default, ditto det ÷ torch det; peaks.
        self.assertEqual(cells[2:], ["70.0", "60.0", "66.0", "–", "–", "0.94×", "1.10×", "–", "55.0", "75.0", "1.36×",
                                     "0.88×", "5.9", "8.0"])

    def test_precision_lines(self):
        lines = overhead_table.precision_lines(self.records, self.models)
        self.assertIn("| resnet50 | bf16 | 66.0 | 60.0 | 1.10× | 55.0 | 1.20× | 6000 | 8000 | 0.75× |", lines)
        self.assertIn("| resnet50 | fp32 | 170.0 | 130.0 | 1.31× | 150.0 | 1.13× | 11000 | 11500 | 0.96× |", lines)

    def test_chart_labels_name_the_precision(self):
        labels = [label for label, _ in overhead_table.chart_values(self.records, self.models)]
        self.assertEqual(labels, ["resnet50", "resnet50 bf16"])

    def test_command_line(self):
        out = self.files.path / "overhead.md"
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "overhead_table.py"), *map(str, self.paths),
                              "--out", str(out), "--svg", str(self.files.path / "overhead.svg")],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        text = out.read_text()
        self.assertIn("Precisions: fp32, bf16.", text)
        self.assertIn("| resnet50 | bf16 | 66.0 |", text)


class OverheadSteps(unittest.TestCase):
    def test_precisions_pair_only_with_themselves(self):
        files = Files(self)
        path = files.write("steps.jsonl", [zoo_line("ditto", "fastest", 130.0, steps=10),
                                           zoo_line("ditto", "fastest", 131.3, steps=100),
                                           zoo_line("ditto", "fastest", 60.0, "bf16", steps=10)])
        runs = overhead_steps.load([path])
        self.assertEqual(set(runs), {("ditto", "resnet50", "fastest", "fp32", 10),
                                     ("ditto", "resnet50", "fastest", "fp32", 100),
                                     ("ditto", "resnet50", "fastest", "bf16", 10)})
        text = overhead_steps.table(runs)
        self.assertIn("| ditto | resnet50 | fastest | fp32 | 130.000 |", text)
        self.assertNotIn("bf16", text)  # measured at one step count only


class RenderDocsPrecision(unittest.TestCase):
    def test_region_lines(self):
        files = Files(self)
        step, zoo = step_fixture(files), zoo_fixture(files)
        data = step_time_table.Data(load_quietly(step_time_table.load, list(step)))
        lines = render_docs.precision_lines(data, overhead_table.load(list(zoo)))
        self.assertIn("| resnet18 | bf16 | eager | 4.000 | 3.200 | 1.25× | 5.000 | 0.80× | 100 | 200 | 0.50× |", lines)
        self.assertIn("| resnet50 | bf16 | 66.0 | 60.0 | 1.10× | 55.0 | 1.20× | 6000 | 8000 | 0.75× |", lines)


class PeerPrecisions(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(peer_common.parse_precisions("fp32,bf16,fp16"), ["fp32", "bf16", "fp16"])
        with self.assertRaisesRegex(ValueError, "unknown precision.*fp8"):
            peer_common.parse_precisions("fp32,fp8")
        with self.assertRaises(ValueError):
            peer_common.parse_precisions(",")


class PrecisionNoiseTable(unittest.TestCase):
    """One ditto-experiment report.csv per precision into one table: rows per precision and
    setting with the report's numbers, the churn decomposition below, a bad file named."""

    def write_report(self, folder, churn_impl, interaction):
        folder.mkdir(parents=True)
        rows = [("setting", "metric", "value", "ci_low", "ci_high"),
                ("IMPL", "accuracy_mean", 0.52, "", ""), ("IMPL", "accuracy_std", 0.001, "", ""),
                ("IMPL", "churn", churn_impl, churn_impl - 0.01, churn_impl + 0.01),
                ("IMPL", "weight_l2", 1.5, "", ""), ("IMPL", "distinct_fingerprints", 5, "", ""),
                ("IMPL", "seconds_per_epoch", 3.25, "", ""),
                ("CONTROL", "accuracy_mean", 0.53, "", ""), ("CONTROL", "churn", 0.0, 0.0, 0.0),
                ("decomposition:churn", "interaction", interaction, interaction - 0.005, interaction + 0.005)]
        with open(folder / "report.csv", "w", newline="") as f:
            csv.writer(f).writerows(rows)

    def test_rows_and_decomposition(self):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            self.write_report(root / "a", 0.0758, -0.0756)
            self.write_report(root / "b", 0.0361, -0.0344)
            out = root / "t.md"
            precision_noise_table.main([f"fp32={root / 'a'}", f"bf16={root / 'b'}", "--out", str(out)])
            text = out.read_text()
            self.assertIn("| fp32 | IMPL | 52.00% | 0.10% | 7.58% [6.58, 8.58] | 1.5 | 5 | 3.25 |", text)
            self.assertIn("| bf16 | IMPL | 52.00% | 0.10% | 3.61% [2.61, 4.61] |", text)
            self.assertIn("| bf16 |  |  | -3.44% [-3.94, -2.94] |", text)
            self.assertNotIn("ALGO+IMPL", text)  # settings a run did not have are left out

    def test_bad_report_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d) / "bad"
            folder.mkdir()
            (folder / "report.csv").write_text("setting,metric,value\nIMPL,churn,abc\n")
            with self.assertRaises(SystemExit) as e:
                precision_noise_table.read_report(str(folder))
            self.assertIn("report.csv: row 2", str(e.exception))


class SettingsCompareTest(unittest.TestCase):
    def test_both_code_bases_per_setting_with_intervals(self):
        with tempfile.TemporaryDirectory() as d:
            ditto, torch = Path(d) / "ditto.csv", Path(d) / "torch.csv"
            ditto.write_text("setting,metric,value,ci_low,ci_high,has_interval\n"
                             "IMPL,churn,0.0912,0.085,0.097,1\nIMPL,churn_pair_min,0.07,,,0\n"
                             "IMPL,churn_pair_max,0.12,,,0\nIMPL,churn_replicas,0.0912,0.06,0.125,1\n"
                             "IMPL,accuracy_mean,0.71,,,0\n"
                             "IMPL,accuracy_std,0.003,0.001,0.005,1\nCONTROL,churn,0,0,0,1\n"
                             "CONTROL,distinct_fingerprints,1,,,0\nIMPL-pytorch,churn,0.09,0.08,0.1,1\n")
            torch.write_text("setting,metric,value,ci_low,ci_high\nIMPL,churn,0.05,0.04,0.06\n"
                             "IMPL,distinct_fingerprints,5,,\nALGO,churn,0.3,,\n")
            rows = settings_compare.table(settings_compare.read(ditto), settings_compare.read(torch))
        self.assertEqual(rows[2], "| ALGO | ditto | – | – | – | – | – | – | – |")
        self.assertEqual(rows[3], "| ALGO | PyTorch | 30.00% | – | – | – | – | – | – |")
        self.assertEqual(rows[4], "| IMPL | ditto | 9.12% [8.50, 9.70] | 7.00–12.00% | [6.00, 12.50] | – | 0.7100 ± 0.0030 | – | – |")
        self.assertEqual(rows[5], "| IMPL | PyTorch | 5.00% [4.00, 6.00] | – | – | – | – | – | 5 |")
        self.assertEqual(rows[6], "| CONTROL | ditto | 0.00% [0.00, 0.00] | – | – | – | – | – | 1 |")
        # A custom setting one side has comes after the paper's four.
        self.assertEqual(rows[8], "| IMPL-pytorch | ditto | 9.00% [8.00, 10.00] | – | – | – | – | – | – |")
        self.assertEqual(rows[9], "| IMPL-pytorch | PyTorch | – | – | – | – | – | – | – |")

    def test_labelled_runs_in_the_order_given(self):
        with tempfile.TemporaryDirectory() as d:
            adam, sgd, out = Path(d) / "adam.csv", Path(d) / "sgd.csv", Path(d) / "out.md"
            adam.write_text("setting,metric,value,ci_low,ci_high\nIMPL,churn,0.08,0.07,0.09\n")
            sgd.write_text("setting,metric,value,ci_low,ci_high\nIMPL,churn,0.12,0.11,0.13\n")
            settings_compare.main(["--run", f"SGD={sgd}", "--run", f"Adam={adam}", "--out", str(out)])
            rows = out.read_text().splitlines()
        self.assertTrue(rows[0].startswith("| setting | run | churn"))
        self.assertEqual(rows[2], "| IMPL | SGD | 12.00% [11.00, 13.00] | – | – | – | – | – | – |")
        self.assertEqual(rows[3], "| IMPL | Adam | 8.00% [7.00, 9.00] | – | – | – | – | – | – |")
        with self.assertRaises(SystemExit):
            settings_compare.main(["--run", "no-label-here"])
        with self.assertRaises(SystemExit):
            settings_compare.main(["--run", f"Adam={adam}"])



class EvalInvarianceTableTest(unittest.TestCase):
    def test_rows_ratio_and_a_bad_line_skipped(self):
        def line(kernels, batch, ms, differing):
            return json.dumps({"model": "resnet18", "image": 32, "examples": 1000, "kernels": kernels, "batch": batch,
                               "ms_per_pass": ms, "differing": differing, "differing_vs_batch": 1000})
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "e.jsonl"
            path.write_text("\n".join([line("fastest", 1000, 20.0, 0), line("batch-invariant", 1000, 100.0, 0),
                                       line("fastest", 7, 200.0, 1000), "{not json",
                                       json.dumps({"model": "x"}), line("batch-invariant", 7, 1200.0, 0)]) + "\n")
            err = io.StringIO()
            with redirect_stderr(err):
                rows = eval_invariance_table.read([str(path)])
        self.assertIn("e.jsonl:4: not JSON", err.getvalue())
        self.assertIn("e.jsonl:5: no image", err.getvalue())
        lines = eval_invariance_table.table(rows).splitlines()
        self.assertEqual(lines[2], "| resnet18 (32, 1000) | 1000 | 20.0 | – | 100.0 | 5.00× | 0 / – / 0 (vs batch 1000) |")
        self.assertEqual(lines[3], "| resnet18 (32, 1000) | 7 | 200.0 | – | 1200.0 | 6.00× | 1000 / – / 0 (vs batch 1000) |")



class LayerKernelsTest(unittest.TestCase):
    def test_names_counts_and_the_convolution_summary(self):
        with tempfile.TemporaryDirectory() as d:
            tj, nc = Path(d) / "t.json", Path(d) / "n.csv"
            tj.write_text(json.dumps({"model": "smallcnn", "steps": 2, "batch": 128, "eval_batch": 128, "kernels": [
                "sm90_xmma_fprop_implicit_gemm_f32f32_tilesize64x64", "sm90_xmma_fprop_implicit_gemm_f32f32_tilesize64x64",
                "void at::native::vectorized_elementwise_kernel<4, float>(int, float)",
                "sm90_xmma_wgrad_implicit_gemm_f32"]}))
            nc.write_text("==PROF== Connected to process\n"
                          '"ID","Kernel Name","Metric Name","Metric Value"\n'
                          '"0","sm90_xmma_fprop_implicit_gemm_f32f32_tilesize64x64","gpu__time_duration.sum","1"\n'
                          '"1","void ditto::cuda::relu_kernel<float>(float const*, float*, long)","gpu__time_duration.sum","1"\n'
                          '"2","sm90_xmma_wgrad_implicit_gemm_f32","gpu__time_duration.sum","1"\n'
                          '"3","cudnn::dgrad2d_engine<float>(int)","gpu__time_duration.sum","1"\n')
            t, _ = layer_kernels.read_torch(str(tj))
            text, summary = layer_kernels.table(t, [("pytorch", layer_kernels.read_ncu(str(nc)))])
        self.assertEqual(t["at::native::vectorized_elementwise_kernel"], 1)
        self.assertIn("| `sm90_xmma_fprop_implicit_gemm_f32f32_tilesize64x64` | yes | 2 | 1 |", text)
        self.assertIn("| `ditto::cuda::relu_kernel` |  | 0 | 1 |", text)
        self.assertEqual(summary, ["ditto pytorch: 2 of PyTorch's 3 convolution launches run the same kernel "
                                   "(3 convolution launches in all)"])


class NcuStepTable(unittest.TestCase):
    HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]

    def write(self, names_us, unit="ns"):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.HEAD)
        for i, (name, us) in enumerate(names_us):
            value = us * {"ns": 1000, "us": 1, "ms": 1e-3}[unit]
            w.writerow([i, 1, "step_time", "h", name, 1, 7, "(256, 1, 1)", "(8, 1, 1)", 0, "9.0", "Command line profiler metrics",
                        "gpu__time_duration.sum", unit, f"{value:,.0f}" if unit == "ns" else str(value)])
        tmp = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        tmp.write("==PROF== Connected to process 1\n" + buf.getvalue())
        tmp.close()
        self.addCleanup(Path(tmp.name).unlink)
        return tmp.name

    def test_the_replayed_step_not_a_run_of_equal_kernels(self):
        # Set-up kernels, then four replays of a 6-kernel step whose optimizer is three equal launches,
        # then an evaluation kernel: the step is the 6 kernels, not the period-1/2 runs of adam.
        step = [("void conv_fwd<float>(int)", 20.0), ("relu_kernel(const float *)", 3.0)] + \
               [("ditto::<unnamed>::adam_kernel(ParamBatch)", 4.0)] * 3 + [("correct_kernel(int *)", 2.0)]
        path = self.write([("init_kernel(float *)", 9.0)] * 2 + step * 4 + [("eval_kernel(float *)", 5.0)])
        s = ncu_step_table.summary(path)
        self.assertEqual(s["kernels"], 6)
        self.assertAlmostEqual(s["kernel_us"], 37.0)
        fams = {f["family"]: (f["launches"], f["us"]) for f in s["families"]}
        self.assertEqual(fams["ditto::<unnamed>::adam_kernel"], (3, 12.0))
        self.assertEqual(fams["conv_fwd<float>"], (1, 20.0))
        self.assertEqual(s["families"][0]["family"], "conv_fwd<float>")  # by time

    def test_blocks_read_repeated_calls_in_launch_order(self):
        # A set-up kernel, three calls of a two-kernel variant, two of a three-kernel one, a last kernel.
        a = [("fill(int)", 2.0), ("scatter(int)", 30.0)]
        b = [("sort(int)", 10.0), ("sort(int)", 12.0), ("segment(int)", 14.0)]
        path = self.write([("init(int)", 1.0)] + a * 3 + b * 2 + [("tail(int)", 5.0)])
        got = [(names, reps, means) for names, reps, means in ncu_step_table.blocks(ncu_step_table.load(path))]
        self.assertEqual([(len(n), r) for n, r, _ in got], [(1, 1), (2, 3), (3, 2), (1, 1)])
        self.assertEqual(got[2][0], ["sort(int)", "sort(int)", "segment(int)"])  # not a run of the equal sorts
        self.assertEqual(got[2][2], [10.0, 12.0, 14.0])
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(ncu_step_table.main(["--blocks", path]), 0)
        self.assertIn("| 2 | 3 | `fill` 2.0, `scatter` 30.0 | 32.0 |", out.getvalue())

    def test_units_and_errors_are_named(self):
        step = [("a(int)", 1.5), ("b(int)", 2.5)]
        self.assertAlmostEqual(ncu_step_table.summary(self.write(step * 3, unit="us"))["kernel_us"], 4.0)
        with self.assertRaisesRegex(ValueError, "no step repeats"):
            ncu_step_table.summary(self.write([("a(int)", 1.0), ("b(int)", 1.0), ("c(int)", 1.0)]))
        with self.assertRaisesRegex(ValueError, "no gpu__time_duration.sum rows"):
            ncu_step_table.load(self.write([]))
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(ncu_step_table.main([self.write([("a(int)", 1.0)])]), 1)
        self.assertIn("ncu_step_table:", err.getvalue())


class FreeDetTable(unittest.TestCase):
    """The goal rows from one session's files: ratios, goals, what is missing or failed."""

    def setUp(self):
        self.dir = Path(tempfile.mkdtemp())

    def lines(self, name, records):
        path = self.dir / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return str(path)

    def files(self, drop_model=None, spmm_rows=True):
        zoo = [("densenet169", 165.0, 180.0, 19, 20), ("densenet201", 230.0, 220.0, 24, 25),
               ("vgg16", 180.0, 227.0, 11, 13), ("vgg19", 206.0, 270.0, 11, 13), ("efficientnet-b0", 90.0, 100.0, 21, 20)]
        ov = [{"model": m, "mode": "deterministic-tuned", "precision": "fp32", "ms_median": d, "peak_mem_bytes": gd * 2**30,
               "tuning_workspace_mb": 4096 if m.startswith("vgg") else 0, "gpu": "G", "commit": "abc"}
              for m, d, _, gd, _ in zoo if m != drop_model]
        tov = [{"model": m, "mode": "default", "precision": "fp32", "ms_median": t, "peak_mem_bytes": gt * 2**30}
               for m, _, t, _, gt in zoo]
        st = [{"model": "smallcnn", "mode": "deterministic-tuned", "graph": True, "precision": "fp32", "ms_median": 0.45},
              {"model": "resnet18", "mode": "deterministic-tuned", "graph": True, "precision": "fp32", "ms_median": 12.0,
               "flops_per_step": 4.2e11}]
        tst = [{"model": m, "mode": "default", "graph": True, "precision": "fp32", "ms_median": v}
               for m, v in (("smallcnn", 0.5), ("resnet18", 17.0))]
        ops = [("roi_align", "bwd", "atomic", 100), ("roi_align", "bwd", "deterministic", 80),
               ("embedding", "scatter", "atomic", 94), ("embedding", "scatter", "sorted", 130),
               ("embedding", "scatter", "atomic", 90, "hot"), ("embedding", "scatter", "sorted", 99, "hot"),
               ("embedding_bag", "scatter", "atomic", 100), ("embedding_bag", "scatter", "sorted", 110),
               ("scatter_add", "scatter", "atomic", 120), ("scatter_add", "scatter", "sorted", 115),
               ("spmm", "fwd", "ditto", 10)]
        if spmm_rows:
            ops += [("spmm", "bwd", "atomic", 300), ("spmm", "bwd", "deterministic", 400),
                    ("spmm", "bwd", "deterministic+plan", 290)]
        csv_path = self.dir / "op_noise.csv"
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["op", "knob", "variant", "shape", "distinct", "runs", "max_abs_diff", "us_per_call",
                        "us_back_to_back"])
            for op, knob, v, us, *shape in ops:
                w.writerow([op, knob, v, shape[0] if shape else "s", 1 if v != "atomic" else 20, 20, 0, us, us / 2])
        return ["--overhead", self.lines("o.jsonl", ov), "--torch-overhead", self.lines("t.jsonl", tov),
                "--step-time", self.lines("s.jsonl", st), "--torch-step-time", self.lines("ts.jsonl", tst),
                "--op-noise", str(csv_path), "--out", str(self.dir / "t.md"), "--json", str(self.dir / "t.json")]

    def test_rows_ratios_and_goals(self):
        with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
            self.assertEqual(free_det_table.main(self.files()), 0)
        listed = json.loads((self.dir / "t.json").read_text())["rows"]
        self.assertEqual(len(listed), 13)  # embedding at two shapes
        rows = {r["row"].split(",")[0]: r for r in listed if not r.get("also", "").startswith("hot")}
        hot = [r for r in listed if r.get("also", "").startswith("hot")]
        self.assertEqual(len(hot), 1)
        self.assertTrue(hot[0]["met"])  # 99 / 90
        self.assertIn("back to back 65.0 vs 47.0 µs (1.38×)", rows["embedding backward"]["also"])
        self.assertAlmostEqual(rows["DenseNet-169 step"]["ratio"], 165 / 180)
        self.assertTrue(rows["DenseNet-169 step"]["met"])
        self.assertFalse(rows["DenseNet-201 step"]["met"])
        self.assertFalse(rows["EfficientNet-B0 peak memory"]["met"])  # 21 vs 20 GiB
        self.assertIn("4096 MiB", rows["VGG-16 peak memory"]["row"])
        self.assertAlmostEqual(rows["ResNet-18 CIFAR fp32 graphed step"]["ratio"], 12.0 / 9.6)
        self.assertFalse(rows["embedding backward"]["met"])     # 130 / 94 > 1.2
        self.assertTrue(rows["embedding_bag backward"]["met"])  # 1.1
        self.assertIn("with a plan 290.0", rows["spmm backward"]["also"])
        self.assertIn("8 of 13 rows", (self.dir / "t.md").read_text())

    def test_a_missing_row_is_an_error_not_a_blank(self):
        for kwargs, message in (({"drop_model": "vgg19"}, "overhead vgg19"), ({"spmm_rows": False}, "spmm has deterministic rows for []")):
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(free_det_table.main(self.files(**kwargs)), 1)
            self.assertIn(message, err.getvalue())
            self.assertFalse((self.dir / "t.md").exists())


if __name__ == "__main__":
    unittest.main(verbosity=2)
