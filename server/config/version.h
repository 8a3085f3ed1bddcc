// The versions this build reports: the etcd version whose API Capstan
// implements (Maintenance.Status, /version, the snapshot's clusterVersion)
// and Capstan's own. Set by CMake (CAPSTAN_ETCD_API_VERSION and friends in
// the top-level CMakeLists.txt).

#ifndef CAPSTAN_SERVER_CONFIG_VERSION_H_
#define CAPSTAN_SERVER_CONFIG_VERSION_H_

namespace capstan::server {

extern const char kEtcdApiVersion[];
extern const char kEtcdClusterVersion[];
// The storage (schema) version etcd 3.6 reports in Status.storageVersion and
// /version once its data is migrated: the cluster version.
extern const char kEtcdStorageVersion[];
extern const char kCapstanVersion[];

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_CONFIG_VERSION_H_
