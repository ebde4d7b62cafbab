"""Tables that are never cut: a rich Console that widens itself to fit a table off the terminal.

On a terminal rich uses the terminal's width. Anywhere else (`minipar tour | cat`, `| tee`, CI
logs, a notebook, ranks writing into `minipar run`'s pipes) it would assume 80 columns and cut
every cell that does not fit with an ellipsis. This Console measures each table it prints there
and, when the table needs more, prints it at the width that fits it, so no column is dropped
and no cell is cut. `minipar run` and the tour pass a real terminal's width on to the ranks
(COLUMNS, FORCE_COLOR), so ranks printing to a terminal still wrap at its edge.
"""

from __future__ import annotations

from rich.console import Console as _RichConsole

WIDE = 10_000  # the width a table is measured at: as wide as its widest rows want


class Console(_RichConsole):
    """rich's Console; off a terminal, a table wider than the console is printed at its width."""

    def print(self, *objects, **kwargs):
        need = 0 if self.is_terminal or kwargs.get("width") else self._table_width(objects)
        if need <= self.width:
            return super().print(*objects, **kwargs)
        saved = self.width
        self.width = need
        try:
            return super().print(*objects, **kwargs)
        finally:
            self.width = saved

    def _table_width(self, objects) -> int:
        """The width the widest table (or a rule's title, which rich would cut) needs."""
        from rich.measure import Measurement
        from rich.rule import Rule
        from rich.table import Table
        from rich.text import Text

        options = self.options.update_width(WIDE)
        need = [Measurement.get(self, options, o).maximum for o in objects if isinstance(o, Table)]
        for rule in (o for o in objects if isinstance(o, Rule)):
            title = rule.title if isinstance(rule.title, Text) else self.render_str(rule.title)
            need.append(title.cell_len + 6)  # rich keeps a few rule characters beside a title
        return max(need, default=0)
