"""Hypothesis strategies shared by the property tests."""

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


@st.composite
def shape_and_mask(draw, shape_strategy=shapes):
    shape = draw(shape_strategy)
    mask = draw(hnp.arrays(np.bool_, shape))
    return shape, mask
