"""The PCIe links of the NICs, the GPUs and the switches and bridges above them, as trained while the benchmarks
load them: recorded HGX trees (sysfs_tree.hgx) planned by collect.host.pcie_link_states, read by bench.link_watch's
sampler as the link files change between its reads, and judged by checks.pcie_links (the step that runs the sampler:
src/gpufleet/benchmarks/host/test_host.py)."""

from __future__ import annotations

from gpufleet.base import profiles, schema
from gpufleet.bench.link_watch import LinkWatch
from gpufleet.checks import pcie_links
from gpufleet.collect.host import pcie_link_states as plan_links
from gpufleet.node.measure import NodeSteps

from sysfs_tree import hgx, vm

NIC3, NIC3_PORT = "0000:74:00.0", "0000:72:01.0"  # switch 3's HCA and the downstream port above it
UPLINK3, ROOT3 = "0000:71:00.0", "0000:70:01.0"  # switch 3's upstream port and the root port above it
GPU3, GPU3_PORT = "0000:73:00.0", "0000:72:00.0"


def _set(tree, bdf: str, speed: str | None = None, width: int | None = None, which: str = "current") -> None:
    dev = tree.devpaths[bdf]
    if speed:
        tree.write(f"{dev}/{which}_link_speed", speed + "\n")
    if width:
        tree.write(f"{dev}/{which}_link_width", f"{width}\n")


def _watch(tree, *changes) -> dict:
    """A LinkWatch over the tree read once, then once after each change (a function of the tree): its summary."""
    watch = LinkWatch(root=str(tree.root))
    watch.sample()
    for change in changes:
        change(tree)
        watch.sample()
    return watch.summary()


def test_the_links_are_each_device_and_each_switch_uplink_once(tmp_path):
    links = {link["bdf"]: link for link in plan_links.links_of(str(hgx(tmp_path).root))}
    # 8 switches: each GPU and HCA under its downstream port, each switch's upstream port under its root port; and
    # the management NIC on a root bus, judged against its own maximum
    assert len(links) == 8 * 3 + 1
    nic = links[NIC3]
    assert (nic["kind"], nic["parent"], nic["max_gen"], nic["max_width"]) == ("nic", NIC3_PORT, 5, 16)
    up = links[UPLINK3]
    assert (up["kind"], up["parent"], sorted(up["below"])) == ("bridge", ROOT3, [GPU3, NIC3])
    assert links["0000:00:1c.0"]["parent"] is None and links["0000:00:1c.0"]["max_width"] == 8
    assert GPU3_PORT not in links and ROOT3 not in links  # their Link Status is the link below them: judged there


def test_links_at_their_maximum_under_load_pass(tmp_path):
    res = pcie_links.pcie_links([_watch(hgx(tmp_path))], loaded=True)
    assert res["status"] == schema.PASS and "25 PCIe link(s) at their maximum under load" in res["reason"]
    assert "(9 NIC(s), 8 GPU(s), 8 switch uplink(s))" in res["reason"]


def test_a_nic_trained_down_fails_naming_it_its_bridge_and_both_figures(tmp_path):
    tree = hgx(tmp_path)
    _set(tree, NIC3, "16.0 GT/s PCIe", 8)
    res = pcie_links.pcie_links([_watch(tree)], loaded=True)
    assert res["status"] == schema.FAIL and res["class"] == "hardware" and res["value"] == 1
    assert (
        f"NIC {NIC3} under {NIC3_PORT}: at most Gen4 (16.0 GT/s) x8 under load, its maximum Gen5 (32.0 GT/s) x16 "
        "(device Gen5 (32.0 GT/s) x16, slot Gen5 (32.0 GT/s) x16)" in res["reason"]
    )
    assert "lspci -vv" in res["remedy"]


def test_a_switch_uplink_at_gen4_fails_naming_what_sits_below_it(tmp_path):
    tree = hgx(tmp_path)
    _set(tree, UPLINK3, "16.0 GT/s PCIe")
    res = pcie_links.pcie_links([_watch(tree)], loaded=True)
    assert res["status"] == schema.FAIL
    assert f"bridge {UPLINK3} (above {GPU3}, {NIC3}) under {ROOT3}: at most Gen4 (16.0 GT/s) x16" in res["reason"]


def test_an_x8_card_in_an_x16_slot_is_at_its_maximum(tmp_path):
    # the slot can do x16, the card x8: the link's most is the lower end's, so x8 passes
    tree = hgx(tmp_path)
    _set(tree, NIC3, width=8)
    _set(tree, NIC3, width=8, which="max")
    assert pcie_links.pcie_links([_watch(tree)], loaded=True)["status"] == schema.PASS


def test_an_idle_link_that_comes_up_under_load_passes_one_that_never_does_fails(tmp_path):
    tree = hgx(tmp_path)
    _set(tree, GPU3, "2.5 GT/s PCIe")  # idle: a GPU lowers its link between kernels
    summary = _watch(tree, lambda t: _set(t, GPU3, "32.0 GT/s PCIe"), lambda t: _set(t, GPU3, "2.5 GT/s PCIe"))
    best = next(link["best"] for link in summary["links"] if link["bdf"] == GPU3)
    assert (best["gen"], best["reads"], best["below_reads"]) == (5, 3, 2)
    assert pcie_links.pcie_links([summary], loaded=True)["status"] == schema.PASS
    # every step's reading together: the best any step saw
    still = _watch(tree)
    assert pcie_links.pcie_links([still], loaded=True)["status"] == schema.FAIL
    assert pcie_links.pcie_links([still, summary], loaded=True)["status"] == schema.PASS
    # a run that loaded no GPU judges nothing
    res = pcie_links.pcie_links([still], loaded=False)
    assert res["status"] == schema.SKIP and "no benchmark loaded a GPU here" in res["reason"]


def test_a_vm_has_no_link_to_judge_and_an_unreadable_link_is_an_error(tmp_path):
    tree = vm(tmp_path / "vm")
    (tree.root / tree.devpaths["0000:00:05.0"] / "max_link_speed").unlink()  # a passthrough GPU without its link
    res = pcie_links.pcie_links([_watch(tree)], loaded=True)
    assert res["status"] == schema.SKIP and "no NIC or GPU on the PCI bus with a link speed" in res["reason"]
    # a link that gives no speed (a virtual function's, a link down) is named and not judged; none at all, an error
    tree = hgx(tmp_path / "hgx")
    (tree.root / tree.devpaths[NIC3] / "current_link_width").unlink()
    res = pcie_links.pcie_links([_watch(tree)], loaded=True)
    assert (
        res["status"] == schema.PASS and f"1 gave no speed, not judged: NIC {NIC3} under {NIC3_PORT}" in res["reason"]
    )
    for path in tree.root.glob("sys/devices/**/current_link_width"):
        path.unlink()
    res = pcie_links.pcie_links([_watch(tree)], loaded=True)
    assert res["status"] == schema.ERROR and "none of the 25 PCIe link(s) gave a speed" in res["reason"]


def test_the_links_are_judged_loaded_only_when_a_step_ran_on_the_gpus(tmp_path):
    summary = _watch(hgx(tmp_path))
    steps = NodeSteps(["matmul", "host"], "quick", 8, profiles.resolve(None))
    steps.log = [{"step": "host", "device": "cuda", "gpus_idle": True, "links": summary}]
    assert steps.links() == ([summary], False)  # the host's own step loads no GPU: its links are not judged
    steps.log.append({"step": "matmul", "device": "cuda", "gpus_idle": False, "links": summary})
    assert steps.links() == ([summary, summary], True)
    steps.log = [{"step": "matmul", "device": "cpu", "links": summary}]
    assert steps.links() == ([], False)  # a machine without GPUs: no result, as for <step>_processes
