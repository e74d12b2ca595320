// The node this process runs for Python: its start and end, and what it knows of the job.
#include <cstdlib>

#include "py_face.h"
#include "step_loop.h"
#include "van.h"

namespace ps {

namespace {

std::unique_ptr<NodeState> g_node;

void Start() {
  if (g_node) throw std::runtime_error("hetu.ps: a node is already running in this process");
  auto node = std::make_unique<NodeState>();
  const Config cfg = Config::FromEnv();
  SimdVariant();  // a bad HETU_SIMD is an error at start, not at a server's first step
  node->po = std::make_unique<Postoffice>(cfg);
  Postoffice* po = node->po.get();
  node->customer = std::make_unique<Customer>([po](int id) { return po->Describe(id); }, cfg.wait_spin_s);
  Customer* customer = node->customer.get();
  if (po->role() == kServer) {
    node->server = std::make_unique<KVServer>(po);
    KVServer* server = node->server.get();
    po->SetDataHandler([server](Message& m) { server->Handle(m); }, KVServer::Brief);
  } else if (po->role() == kWorker) {
    node->worker = std::make_unique<KVWorker>(po, customer);
    po->SetDataHandler(
        [customer](Message& m) {
          if (!m.meta.request()) customer->OnResponse(m);
        },
        [](const Message&) { return true; });
    po->SetDeathHandler([customer](const std::string& why) { customer->FailAll(why); });
  }
  {
    py::gil_scoped_release nogil;
    po->Start();
  }
  g_node = std::move(node);
}

void Finalize() {
  if (!g_node) return;
  {
    py::gil_scoped_release nogil;
    g_node->po->Finalize();
  }
  g_node.reset();
}

}  // namespace

NodeState& Node() {
  if (!g_node) throw std::runtime_error("hetu.ps: this process has not started a node (call hetu.ps.start())");
  return *g_node;
}

bool NodeRunning() { return g_node != nullptr; }

KVWorker& Worker() {
  if (!Node().worker) throw std::runtime_error("hetu.ps: table operations need DMLC_ROLE=worker");
  return *g_node->worker;
}

double DefaultWaitTimeout() {
  const char* e = std::getenv("PS_WAIT_TIMEOUT");
  return e ? std::atof(e) : 600.0;
}

void BindNode(py::module_& m) {
  m.def("start", &Start, "Starts this process's node; role and peers from DMLC_* variables. Returns once all nodes are connected.");
  m.def("finalize", &Finalize, "Worker: tells the scheduler it is done. All roles: stops the node.");
  m.def(
      "wait_for_end",
      [](double timeout) {
        Postoffice* po = Node().po.get();
        std::string why;
        bool ended;
        {
          py::gil_scoped_release nogil;
          ended = po->WaitForEnd(timeout, &why);
        }
        return ended ? py::object(py::str(why)) : py::object(py::none());
      },
      py::arg("timeout") = 0.0,
      "Scheduler/server: blocks until the job ends: '' if it ended cleanly, else why it failed; None on timeout.");
  m.def("rank", [] { return Node().po->rank(); });
  m.def("role", [] { return std::string(RoleName(Node().po->role())); });
  m.def("num_workers", [] { return Node().po->num_workers(); });
  m.def("num_servers", [] { return Node().po->num_servers(); });
  m.def("describe", [](int id) { return Node().po->Describe(id); });
  m.def("failure", [] { return Node().po->failure(); });
  m.def("dropped_messages", [] { return Node().po->dropped_messages(); });
  m.def(
      "requests_in_flight",
      [] {
        py::list out;
        if (!NodeRunning()) return out;
        for (const auto& u : Node().customer->InFlight()) out.append(py::make_tuple(u.what, u.seconds, u.owed_by));
        return out;
      },
      "The requests still owed answers: (what, seconds since sent, [nodes that have not answered]).");
  m.def("van_types", [] { return Van::Types(); }, "The DMLC_PS_VAN_TYPE values this build accepts.");
#ifdef PS_WITH_UCX
  m.def("_ucx_send_raw", [](const std::string& host, int port, const std::string& header, const std::string& payload) {
    return SendRawUcxMessage(host, port, header, payload);
  }, py::call_guard<py::gil_scoped_release>());
#endif
  m.def(
      "barrier",
      [](int group, double timeout) {
        Postoffice* po = Node().po.get();
        py::gil_scoped_release nogil;
        po->Barrier(group, timeout);
      },
      py::arg("group"), py::arg("timeout"));
  m.attr("WORKERS") = static_cast<int>(kWorkerGroup);
  m.attr("SERVERS") = static_cast<int>(kServerGroup);
  m.attr("ALL") = static_cast<int>(kAllGroup);
}

}  // namespace ps
