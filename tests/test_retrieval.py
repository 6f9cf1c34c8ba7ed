"""The datastore of the target's own answers (specviz/core/retrieval.py): what a retrieval draft continues with."""
import numpy as np

from specviz.config import DEFAULT_TARGET
from specviz.core import retrieval
from specviz.core.retrieval import Datastore


def test_longest_suffix_and_the_vote():
    store = Datastore([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [9, 2, 3, 4, 5], [8, 3, 4, 7]])
    assert len(store) == 19
    # (2, 3) occurs three times: 4 follows all of them, then 5 (2 votes) before 6 (1 vote), then each answer ends
    assert store.drafts([7, 2, 3], 4) == [[4, 5], [4, 6]]
    assert store.drafts([7, 2, 3], 2) == [[4, 5]]           # the budget goes to the most voted nodes
    assert store.drafts([7, 2, 3], 4, depth=1) == [[4]]
    # the longer suffix (1, 2, 3) decides where it occurs: 4, then 5 and 6 tie (the first seen first)
    assert store.drafts([1, 2, 3], 3) == [[4, 5], [4, 6]]
    # (3, 4) occurs four times: 5 (2 votes), 6 and 7 (1 each)
    assert store.drafts([0, 3, 4], 3) == [[5], [6], [7]]
    assert store.drafts([3, 4], 0) == []
    assert store.drafts([4], 3) == []                 # one token is below the shortest suffix looked up
    assert store.drafts([7, 7], 3) == []              # never seen
    assert store.drafts([2, 3, 99999], 3) == []       # a token beyond the datastore's ids: no suffix has it


def test_a_clear_vote_is_a_chain_and_a_split_one_a_fork():
    # after (1, 2): 10 in 7 of 9 answers, then 20 in all of those; 11 and 12 once each
    store = Datastore([[1, 2, 10, 20, 30]] * 7 + [[1, 2, 11], [1, 2, 12]])
    assert store.drafts([1, 2], 3) == [[10, 20, 30]]
    assert store.drafts([1, 2], 5) == [[10, 20, 30], [11], [12]]
    assert store.drafts([1, 2], 8, depth=2) == [[10, 20], [11], [12]]
    assert store.drafts([1, 2], 99) == store.drafts([1, 2], retrieval.MAX_DEPTH + 9)


def test_a_split_vote_stops_the_draft():
    # after (1, 2) many different tokens follow: none holds MIN_SHARE of the votes
    store = Datastore([[1, 2, t] for t in range(10, 30)])
    assert retrieval.MIN_SHARE > 1 / 20
    assert store.drafts([1, 2], 3) == []
    assert Datastore([]).drafts([1, 2], 3) == []


def test_sequences_do_not_run_into_each_other():
    store = Datastore([[1, 2], [3, 4]])
    assert store.drafts([1, 2], 2) == []            # the first answer ended after 2
    assert store.drafts([2, 3], 2) == []            # no answer holds 2 then 3


def test_saved_and_loaded_it_drafts_the_same(tmp_path):
    store = Datastore([[1, 2, 3, 4, 5], [], [1, 2, 3, 6], [8, 3, 4, 7]])
    store.save(tmp_path / retrieval.DATASTORE_FILE)
    loaded = Datastore.load(tmp_path / retrieval.DATASTORE_FILE)
    assert len(loaded) == len(store) == 13
    assert loaded.drafts([1, 2, 3], 4) == store.drafts([1, 2, 3], 4) == [[4, 5], [6]]


def test_the_embedded_target_has_its_answers_as_datastore():
    from specviz.engines.tree import ANSWERS

    store = retrieval.datastore_for(DEFAULT_TARGET, ANSWERS[DEFAULT_TARGET])  # the engines hand the source
    assert store is retrieval.datastore_for(DEFAULT_TARGET)  # built once per process
    assert len(store) > 2_500_000 and store.max_order == retrieval.MAX_ORDER
    assert DEFAULT_TARGET in retrieval.datastores()
    assert retrieval.datastore_for("someone/else") is None


def test_the_voters_are_spaced_as_linspace_spaces_them_and_the_largest_key_is_found():
    """With more occurrences than CANDIDATES, the ones that vote are those np.linspace spaces evenly over all of them
    (in key order); a suffix whose key is the largest a uint64 holds (16-bit ids, four of the largest) is found."""
    store = Datastore([[5, 6, t % 7] for t in range(1000)])
    keys, where = store.tables[2]
    key = np.uint64(store._key([5, 6]))
    lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
    assert hi - lo == 1000 > retrieval.CANDIDATES
    expected = where[np.linspace(lo, hi - 1, retrieval.CANDIDATES).astype(np.int64)]
    assert np.array_equal(store.occurrences([5, 6]), expected)
    assert np.array_equal(store.occurrences([0, 5, 6]), expected)  # (0, 5, 6) never occurs: the pair decides
    top = (1 << 16) - 1
    big = Datastore([[top] * 6, [1, 2, 3]])
    assert big.bits == 16 and big.max_order == 4 and big._key([top] * 4) == retrieval.MAX_KEY
    assert big.occurrences([top] * 4).tolist() == [3, 4, 5]
    assert big.drafts([top] * 4, 2) == [[top, top]]
