"""Sharded loading: every checkpoint format restored with ``mesh=2x4`` on 8 simulated devices
equals its one-device load, with each parameter in its rule-table sharding, and no read (nor any
device) ever holding more of a sharded parameter than one device's block; uptraining and
fine-tuning (with FSDP) from a checkpoint on 2x4 end where one device's runs end."""


def test_every_format_loads_straight_into_its_shardings(eight_devices):
    rows = eight_devices("loading")  # tests/sharded_loading.py
    kinds = {(r["kind"], r["k"]) for r in rows}
    assert kinds == {(kind, k) for kind in ("gqa_jax", "t5x", "t5x_orbax") for k in (8, 1)} | {
        ("huggingface", 8)
    }
    for r in rows:
        assert r["found"] == r["kind"], r
        assert r["params"] == 52 and not r["unequal"] and not r["wrong_sharding"], r
        # MHA on a 4-way model axis: 40 of 52 parameters sharded; MQA's K/V kernels replicate
        assert r["sharded"] == (40 if r["k"] == 8 else 32), r
        assert not r["full_reads"], r  # every block read was one device's share, never the whole
        assert r["blocks_read"] == (0 if r["kind"] == "gqa_jax" else 52), r  # ours: orbax reads
        if r["kind"] == "t5x":  # Adafactor's state around the loaded model: created sharded
            assert r["opt_wrong"] == 0 and r["opt_sharded"] > 0, r


def test_uptraining_and_fine_tuning_from_a_checkpoint_on_a_mesh_equal_one_device(eight_devices):
    rows = {r["recipe"]: r for r in eight_devices("train")}  # tests/sharded_loading.py --train
    assert set(rows) == {"uptrain", "finetune"}
    for r in rows.values():
        assert r["steps"] == 2 and r["kind"] == "t5x", r
    up, fine = rows["uptrain"], rows["finetune"]
    assert up["max_param_diff_2x4"] <= 1e-5 and up["wi_0_spec_2x4"] == ["None", "model"], up
    # fine-tuning on the mesh with FSDP: the parameters split over data as well
    assert fine["max_param_diff_2x4_fsdp"] <= 1e-5 and fine["wi_0_spec_2x4_fsdp"] == ["data", "model"], fine
