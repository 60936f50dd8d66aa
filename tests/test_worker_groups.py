"""tests/support/worker_groups.py, which keeps a group's tests on one pytest-xdist worker:
the scope the scheduler gives a test is the group its worker wrote, read when the
scheduler first asks and again for a test it has not read."""

from worker_groups import GroupScheduling, read_groups, write_groups


class Config:
    """What xdist's loadscope reads from pytest's config: three workers."""

    def getvalue(self, name):
        return {"tx": ["3*popen"]}[name]


def test_each_workers_groups_are_read_back_merged(tmp_path):
    write_groups(tmp_path, "gw0", {"a.py::t1": "ray-serve", "a.py::t2": "a.py"})
    write_groups(tmp_path, "gw1", {"a.py::t1": "ray-serve", "b.py::t3": "ray-serve"})
    assert read_groups(tmp_path) == {"a.py::t1": "ray-serve", "a.py::t2": "a.py",
                                     "b.py::t3": "ray-serve"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["gw0.json", "gw1.json"]


def test_tests_of_one_group_in_different_modules_share_a_scope(tmp_path):
    write_groups(tmp_path, "gw0", {"a.py::t1": "ray-serve", "b.py::t2": "ray-serve",
                                   "b.py::t3": "b.py"})
    scheduler = GroupScheduling(Config(), directory=tmp_path)
    assert scheduler._split_scope("a.py::t1") == scheduler._split_scope("b.py::t2") == "ray-serve"
    assert scheduler._split_scope("b.py::t3") == "b.py"


def test_groups_written_after_the_first_read_are_still_used(tmp_path):
    # The controller asked before any worker's file had landed: the test is not left to
    # its module's scope, which would start a Ray on every worker.
    scheduler = GroupScheduling(Config(), directory=tmp_path)
    assert scheduler._split_scope("c.py::t0") == "c.py"
    write_groups(tmp_path, "gw2", {"a.py::t1": "ray-serve", "b.py::t2": "ray-serve"})
    assert scheduler._split_scope("a.py::t1") == scheduler._split_scope("b.py::t2") == "ray-serve"


def test_a_test_no_worker_grouped_falls_back_to_its_module(tmp_path):
    write_groups(tmp_path, "gw0", {"a.py::t1": "ray-serve"})
    scheduler = GroupScheduling(Config(), directory=tmp_path)
    assert scheduler._split_scope("d.py::TestX::t9[1]") == "d.py"
