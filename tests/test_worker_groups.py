"""tests/support/worker_groups.py, which keeps a group's tests on one pytest-xdist worker:
the scope the scheduler gives a test is the group its worker wrote, read when the
scheduler first asks and again for a test it has not read."""

from types import SimpleNamespace

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


class Worker:
    """What loadscope drives of a worker: the indexes of the tests it is sent."""

    def __init__(self, name):
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent = []

    def send_runtest_some(self, indexes):
        self.sent.extend(indexes)

    def shutdown(self):
        pass  # loadscope's word that no work is left for this worker


class Options:
    loadscopereorder = True


class ThreeWorkers(Config):
    option = Options()


def test_the_first_group_is_handed_out_before_any_other(tmp_path):
    # By test count, loadscope would hand out the six-test modules first and queue the
    # long Ray group behind one of them on a worker already busy.
    collection = ([f"m{m}.py::t{t}" for m in range(6) for t in range(6)]
                  + ["s.py::a", "s.py::b", "l.py::a", "l.py::b"])
    groups = {nodeid: nodeid.split("::")[0] for nodeid in collection}
    groups.update({"s.py::a": "ray-serve", "s.py::b": "ray-serve",
                   "l.py::a": "ray-serve", "l.py::b": "ray-serve"})
    write_groups(tmp_path, "gw0", groups)
    scheduler = GroupScheduling(ThreeWorkers(), directory=tmp_path,
                                first=("ray-serve",))
    workers = [Worker(f"gw{i}") for i in range(3)]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    first_of = [collection[worker.sent[0]] for worker in workers]
    assert first_of[0] == "s.py::a" and all(first.startswith("m") for first in first_of[1:])
    # The group's four tests, in two modules, all went to that first worker.
    assert [collection[i] for i in workers[0].sent[:4]] == ["s.py::a", "s.py::b",
                                                            "l.py::a", "l.py::b"]
