"""The datastore of the target's own answers (specviz/retrieval.py): what a retrieval draft continues with."""
from specviz import retrieval
from specviz.config import DEFAULT_TARGET
from specviz.retrieval import Datastore


def test_longest_suffix_and_the_vote():
    store = Datastore([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [9, 2, 3, 4, 5], [8, 3, 4, 7]])
    assert len(store) == 19
    # (2, 3) occurs three times: 4 follows all of them, then 5 (2 of 3), then each answer ends
    assert store.continuation([7, 2, 3], 4) == [4, 5]
    # the longer suffix (1, 2, 3) decides where it occurs: 4, then 5 and 6 tie (first seen wins), then the end
    assert store.continuation([1, 2, 3], 3) == [4, 5]
    # (3, 4) occurs four times: 5 holds 2 of 4, so the draft follows it
    assert store.continuation([0, 3, 4], 2) == [5]
    assert store.continuation([3, 4], 0) == []
    assert store.continuation([4], 3) == []               # one token is below the shortest suffix looked up
    assert store.continuation([7, 7], 3) == []            # never seen
    assert store.continuation([2, 3, 99999], 3) == []     # a token beyond the datastore's ids: no suffix has it


def test_a_split_vote_stops_the_draft():
    # after (1, 2) five different tokens follow: none holds MIN_SHARE of the votes
    store = Datastore([[1, 2, t] for t in (10, 11, 12, 13, 14)])
    assert retrieval.MIN_SHARE > 1 / 5
    assert store.continuation([1, 2], 3) == []
    assert Datastore([]).continuation([1, 2], 3) == []


def test_sequences_do_not_run_into_each_other():
    store = Datastore([[1, 2], [3, 4]])
    assert store.continuation([1, 2], 2) == []            # the first answer ended after 2
    assert store.continuation([2, 3], 2) == []            # no answer holds 2 then 3


def test_the_embedded_target_has_its_answers_as_datastore():
    store = retrieval.datastore_for(DEFAULT_TARGET)
    assert store is retrieval.datastore_for(DEFAULT_TARGET)  # built once per process
    assert len(store) > 2_500_000 and store.max_order == retrieval.MAX_ORDER
    assert DEFAULT_TARGET in retrieval.datastores()
    assert retrieval.datastore_for("someone/else") is None
