"""The one topology: DeepSpeed's rank layout on every axis, real gloo ranks."""

from __future__ import annotations

from ds_engine.topology import TopologyError, build_topology, get_topology, reset_topology
from rank_testing import spawn


def _groups(rank, world, sizes, ep_sizes):
    topo = build_topology(**sizes)
    axes = ["pipe", "data", "sequence", "tensor", "data_sequence"]
    found = {axis: (topo.ranks(axis), topo.coord(axis), topo.size(axis)) for axis in axes}
    for ep in ep_sizes:
        ep_group, edp_group = topo.expert_groups(ep)
        import torch.distributed as dist

        found[f"ep{ep}"] = (dist.get_process_group_ranks(ep_group), dist.get_process_group_ranks(edp_group))
    assert get_topology() is topo and build_topology(**sizes) is topo
    try:
        build_topology(pipe=world)  # another layout in the same job
    except TopologyError as e:
        found["again"] = str(e)
    reset_topology()
    return found


def test_eight_ranks_pipe_data_tensor_follow_deepspeeds_process_topology():
    # DeepSpeed's ProcessTopology(axes=[pipe, data, model], dims=[2, 2, 2]): rank = 4 pipe + 2 data + model
    results = spawn(_groups, 8, {"pipe": 2, "tensor": 2}, [2])
    for rank, found in enumerate(results):
        pipe, data, model = rank // 4, (rank // 2) % 2, rank % 2
        assert found["tensor"] == ([4 * pipe + 2 * data, 4 * pipe + 2 * data + 1], model, 2)
        assert found["data"] == ([4 * pipe + model, 4 * pipe + 2 + model], data, 2)
        assert found["pipe"] == ([2 * data + model, 4 + 2 * data + model], pipe, 2)
        assert found["sequence"] == ([rank], 0, 1)
        assert found["data_sequence"] == found["data"]
        # ep 2 over a data axis of 2: both data ranks hold different experts; nobody shares an expert
        assert found["ep2"] == (found["data"][0], [rank])
        assert "already built" in found["again"]


def test_four_ranks_sequence_groups_are_consecutive_and_zero_reduces_over_data_x_sequence():
    results = spawn(_groups, 4, {"sequence": 2}, [1, 2])
    for rank, found in enumerate(results):
        assert found["sequence"] == ([rank // 2 * 2, rank // 2 * 2 + 1], rank % 2, 2)
        assert found["data"] == ([rank % 2, rank % 2 + 2], rank // 2, 2)
        assert found["data_sequence"] == ([0, 1, 2, 3], rank, 4)
        assert found["ep1"] == ([rank], found["data"][0])
        assert found["ep2"] == (found["data"][0], [rank])


def _expert_groups_of_pure_data(rank, world):
    topo = get_topology()  # nothing asked for another axis: pure data parallelism
    import torch.distributed as dist

    ep, edp = topo.expert_groups(2)
    found = (topo.sizes, dist.get_process_group_ranks(ep), dist.get_process_group_ranks(edp))
    try:
        topo.expert_groups(3)
    except TopologyError as e:
        found += (str(e),)
    reset_topology()
    return found


def test_expert_groups_are_consecutive_data_ranks_and_experts_repeat_every_ep_ranks():
    # DeepSpeed's groups at world 4, ep 2: expert-parallel [0,1],[2,3]; expert-data-parallel [0,2],[1,3]
    for rank, (sizes, ep, edp, error) in enumerate(spawn(_expert_groups_of_pure_data, 4)):
        assert sizes == {"pipe": 1, "data": 4, "sequence": 1, "tensor": 1}
        assert ep == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert edp == [rank % 2, rank % 2 + 2]
        assert "expert-parallel size 3 must divide the data-parallel size 4" in error and "[1, 2, 4]" in error


def _bad(rank, world):
    import torch.distributed as dist

    try:
        build_topology(tensor=3)
    except TopologyError as e:
        dist.barrier()  # no rank leaves (taking the store down) before the other has joined
        return str(e)


def test_degrees_that_do_not_divide_the_world_name_the_numbers():
    (message, _) = spawn(_bad, 2)
    assert "tensor 3" in message and "does not divide the world size 2" in message


def _without_process_group(rank, world):
    import torch.distributed as dist

    dist.destroy_process_group()  # a fresh process: no other test's process group can leak in
    try:
        build_topology()
    except TopologyError as e:
        return str(e)


def test_without_torch_distributed_the_error_says_what_to_call():
    (message,) = spawn(_without_process_group, 1)
    assert "call deepspeed.init_distributed() first" in message
