// The admin dashboard: one self-contained HTML page (inline CSS and JS, no
// external resources: the machines have no internet) that polls the
// /api/v1/* JSON every second and draws link utilisation over time, a
// Gantt chart of scheduled transfers per link, the delay histogram, drop
// counts per reason, hosts and each job's model version.
#ifndef MLFABRIC_SCHEDULER_ADMIN_DASHBOARD_H_
#define MLFABRIC_SCHEDULER_ADMIN_DASHBOARD_H_

#include <string>

namespace mlfabric::admin {

const std::string& DashboardHtml();

}  // namespace mlfabric::admin

#endif  // MLFABRIC_SCHEDULER_ADMIN_DASHBOARD_H_
