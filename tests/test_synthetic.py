"""Synthetic tasks: answers correct by construction, exact lengths, determinism, resumable batches."""

import numpy as np
import pytest
import torch

from posenc.data.synthetic import (BLANK, DIGITS, IGNORE_INDEX, KEY_MARK, LETTERS, READ, SEP, TASKS, WRITE,
                                   TaskBatches, make_task)


def rows(task, length, n=16, seed=0):
    ds = make_task(task, length, n, seed)
    return [(np.array(r["ids"]), np.array(r["answer_mask"])) for r in ds]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length", [64, 65, 256])
def test_every_instance_has_the_requested_length_and_an_answer(task, length):
    for ids, mask in rows(task, length):
        assert ids.shape == (length + 1,) and mask.shape == (length,)
        assert mask.any() and ids.min() >= 0 and ids.max() < 256


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_data_other_seed_or_length_other_data(task):
    assert make_task(task, 64, 8, seed=3)[:] == make_task(task, 64, 8, seed=3)[:]
    assert make_task(task, 64, 8, seed=3)["ids"] != make_task(task, 64, 8, seed=4)["ids"]
    a, b = make_task(task, 64, 8, seed=3)["ids"], make_task(task, 128, 8, seed=3)["ids"]
    assert [r[:20] for r in a] != [r[:20] for r in b]  # another length is another stream


def test_passkey_answer_is_the_key_hidden_in_the_filler():
    for ids, mask in rows("passkey", 128):
        y = ids[1:]
        (first,) = np.flatnonzero(ids == KEY_MARK)[:1]
        key = ids[first + 1 : first + 6]
        assert np.isin(key, DIGITS).all() and np.isin(ids, DIGITS).sum() == 10  # the key, twice
        assert (y[mask] == key).all() and ids[1:][~mask][-1] == KEY_MARK


def test_copy_answer_is_the_string_before_the_separator():
    for ids, mask in rows("copy", 100):
        m = int(np.flatnonzero(ids == SEP)[0])
        assert (ids[1:][mask] == ids[:m]).all() and np.isin(ids[:m], LETTERS).all()


def test_mqar_answer_is_the_value_stored_with_each_key():
    for ids, mask in rows("mqar", 128):
        pairs = 129 // 8
        store = dict(zip(ids[0 : 2 * pairs : 2], ids[1 : 2 * pairs : 2]))
        assert len(store) == pairs  # distinct keys
        queries = np.flatnonzero(mask)
        assert sorted(ids[queries]) == sorted(store) and all(store[ids[q]] == ids[q + 1] for q in queries)
        assert (ids[2 * pairs :][~np.isin(np.arange(2 * pairs, 129), np.r_[queries, queries + 1])] == BLANK).all()


def test_selective_copy_answer_is_the_letters_in_order_without_blanks():
    for ids, mask in rows("selective_copy", 96):
        sep = int(np.flatnonzero(ids == SEP)[0])
        letters = ids[:sep][ids[:sep] != BLANK]
        assert len(letters) == 16 and (ids[1:][mask] == letters).all()


def test_flip_flop_read_returns_the_last_written_bit():
    for ids, mask in rows("flip_flop", 200):
        ops, bits = ids[0:200:2], ids[1:201:2]
        assert ops[0] == WRITE and (ops == READ).sum() == mask.sum()
        last = None
        for op, bit in zip(ops, bits):
            if op == WRITE:
                last = bit
            elif op == READ:
                assert bit == last


@pytest.mark.parametrize("task", TASKS)
def test_batches_score_only_the_answer_and_resume_exactly(task):
    b = TaskBatches(task, 64, batch_size=4, seed=0)
    first = b.next()
    x, y = first.x, first.y
    assert x.shape == y.shape == (4, 64) and x.dtype == torch.int64
    assert (y != IGNORE_INDEX).any() and (y == IGNORE_INDEX).any()
    state = b.state_dict()
    after = b.next()
    b.load_state_dict(state)
    again = b.next()
    assert torch.equal(after.x, again.x) and torch.equal(after.y, again.y)
    every = TaskBatches(task, 64, 4, seed=0, targets="all").next()
    x_all, y_all = every.x, every.y
    assert torch.equal(x_all, x) and torch.equal(y_all[:, :-1], x_all[:, 1:])


def test_ranks_shard_the_global_batch():
    whole = TaskBatches("copy", 32, 4, seed=1).next().x
    shards = [TaskBatches("copy", 32, 2, seed=1, rank=r, world_size=2).next().x for r in (0, 1)]
    assert torch.equal(torch.cat(shards), whole)


def test_unknown_task_or_short_length_is_refused():
    with pytest.raises(ValueError, match="dataset.task"):
        make_task("sorting", 64, 1, 0)
    with pytest.raises(ValueError, match="length"):
        TaskBatches("selective_copy", 20, 2, 0)


def test_the_dataset_config_instantiates_to_a_task_spec():
    """`dataset=synthetic dataset.task=flip_flop` composes and builds a task spec."""
    from omegaconf import OmegaConf

    from posenc.build import build_data
    from posenc.config import compose
    from posenc.data.synthetic import SyntheticTask

    cfg = compose(["dataset=synthetic", "dataset.task=flip_flop"], bench=False)
    spec = build_data(cfg)
    assert isinstance(spec, SyntheticTask) and spec.task == "flip_flop" and spec.eval_multiples == [1, 2, 4, 8]
    assert spec.vocab_size == 256 and OmegaConf.select(cfg, "dataset.targets") == "answer"
    assert spec.batches(32, 2, seed=0).next().x.shape == (2, 32)
    with pytest.raises(ValueError, match="dataset.task"):
        SyntheticTask(task="sorting")


def test_validation_instances_are_held_out_from_the_final_evaluation():
    for task in TASKS:
        assert make_task(task, 64, 4, seed=0, split="validation")["ids"] != make_task(task, 64, 4, seed=0)["ids"]
