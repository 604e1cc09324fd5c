"""Compact schedules of packed variable-length batches: the public name of :mod:`cupy_dash.schedule.varlen`,
whose public names it re-exports (:mod:`cupy_dash.schedule` has ``VarlenSchedule`` and ``build_varlen`` too)."""
from .schedule.compact import ColumnRecords
from .schedule.varlen import RANK_ASC_N, RANK_COUNT, RANK_DESC_N, VarlenSchedule, build_varlen, expand

__all__ = ["ColumnRecords", "RANK_ASC_N", "RANK_COUNT", "RANK_DESC_N", "VarlenSchedule", "build_varlen", "expand"]
