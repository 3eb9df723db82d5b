from relay_engine.core.data import BatchOrder, DataPosition


def test_each_epoch_visits_every_sample_once_in_a_seeded_order() -> None:
    order = BatchOrder(10, 3, seed=7, span_epochs=True)
    batches = order.batches(DataPosition())
    seen = [i for _ in range(10) for i in next(batches)]  # 30 samples: three epochs
    for epoch in range(3):
        assert sorted(seen[epoch * 10 : (epoch + 1) * 10]) == list(range(10))
    assert seen[:10] != seen[10:20]
    again = BatchOrder(10, 3, seed=7, span_epochs=True).batches(DataPosition())
    assert seen == [i for _ in range(10) for i in next(again)]


def test_spanning_batches_keep_their_size_and_resume_from_a_position() -> None:
    order = BatchOrder(10, 4, seed=1, span_epochs=True)
    position = DataPosition()
    straight = []
    for _ in range(6):
        indices, position = order.next_batch(position)
        assert len(indices) == 4
        straight.append(indices)
    # Replaying from the position after batch 3 gives batches 4..6 again.
    position = DataPosition()
    for _ in range(3):
        _, position = order.next_batch(position)
    resumed = BatchOrder(10, 4, seed=1, span_epochs=True).batches(position)
    assert [next(resumed) for _ in range(3)] == straight[3:]


def test_epoch_batches_end_at_the_epoch() -> None:
    order = BatchOrder(10, 4, seed=1, span_epochs=False)
    position = DataPosition()
    sizes = []
    for _ in range(4):
        indices, position = order.next_batch(position)
        sizes.append(len(indices))
    assert sizes == [4, 4, 2, 4]
    assert order.batches_per_epoch() == 3


def test_different_seeds_give_different_orders() -> None:
    a, _ = BatchOrder(100, 100, seed=1, span_epochs=True).next_batch(DataPosition())
    b, _ = BatchOrder(100, 100, seed=2, span_epochs=True).next_batch(DataPosition())
    assert a != b and sorted(a) == sorted(b)
