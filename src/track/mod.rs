//! The memory tracker: tags, per-tag stats and budgets, records and reports.
