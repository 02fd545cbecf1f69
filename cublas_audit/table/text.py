"""Text cells of a table: which are blank (dispatch.blank_as_missing reads them as missing), and
text held as one Python string per distinct value (what dispatch types every known text column
as)."""

from __future__ import annotations

import numpy as np
import pandas as pd

# Text columns whose every row holds its own value: stored as pyarrow keeps text, every other
# text column as `shared_text`.
PER_ROW_TEXT = ("case_id",)


def shared_text(values: pd.Series) -> pd.Series:
    """Text as the "string" dtype, each distinct value one Python string that every row holding
    it points to (pandas' python storage): 8 bytes a row, where pyarrow's storage keeps each
    row's characters (a kernel list of 250 characters: 145 MB of a 1,000,000-row table, for its
    28 distinct values)."""
    if values.dtype == pd.StringDtype("python"):
        return values  # held so already (validation.typed_csv reads known text columns so)
    text = values if isinstance(values.dtype, pd.StringDtype) else values.astype("string")
    codes, distinct = pd.factorize(text)
    objects = np.array([*distinct, pd.NA], dtype=object)  # a missing value's code, -1: the last
    shared = pd.array(objects[codes], dtype=pd.StringDtype("python"))
    return pd.Series(shared, index=values.index, name=values.name)


def blank_cells(values: pd.Series) -> pd.Series:
    """True at the text cells that are empty or only white space (str.isspace's, as a regex's
    \\s). Only cells whose first character is blank can be, so only those few are tested one
    by one: a regex over every cell took 10 s of a 262,144-row map table's read."""
    if not (pd.api.types.is_string_dtype(values) or values.dtype == object):
        return pd.Series(False, index=values.index)
    if isinstance(values.dtype, pd.StringDtype) and values.dtype.storage == "python":
        # shared_text's (and validation.typed_csv's): each distinct value tested once
        codes, distinct = pd.factorize(values)
        blanks = np.array([not value.strip() for value in distinct] + [False], dtype=bool)
        return pd.Series(blanks[codes], index=values.index)
    first = values.str[:1]
    blank_starts = [c for c in first.dropna().unique() if isinstance(c, str) and not c.strip()]
    maybe = first.isin(blank_starts).to_numpy(dtype=bool)
    blank = np.zeros(len(values), dtype=bool)
    if maybe.any():  # each distinct value of those tested once (a column of "": every row)
        codes, distinct = pd.factorize(values[maybe])
        tested = [isinstance(v, str) and not v.strip() for v in distinct]
        blank[maybe] = np.array([*tested, False], dtype=bool)[codes]
    return pd.Series(blank, index=values.index)
