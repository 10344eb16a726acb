"""Reporting: parse our metrics JSONL and Megatron/Bridge logs, write markdown tables and PNG plots (torch-free)."""

from nemo_muon.reporting.jsonl import parse_metrics_jsonl, read_metrics_jsonl
from nemo_muon.reporting.loader import NotARun, load_run
from nemo_muon.reporting.megatron_log import parse_megatron_log, read_megatron_log
from nemo_muon.reporting.records import RunLog, TrainPoint, ValPoint
from nemo_muon.reporting.report import analyze, render_table, write_report, write_report_for
from nemo_muon.reporting.summary import PairComparison, RunSummary, compare_pair, find_pairs, summarize
from nemo_muon.reporting.tables import markdown_table, text_table

__all__ = [
    "NotARun", "PairComparison", "RunLog", "RunSummary", "TrainPoint", "ValPoint", "analyze", "compare_pair", "find_pairs",
    "load_run", "markdown_table", "parse_megatron_log", "parse_metrics_jsonl", "read_megatron_log",
    "read_metrics_jsonl", "render_table", "summarize", "text_table", "write_report", "write_report_for",
]
