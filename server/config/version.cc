#include "server/config/version.h"

namespace capstan::server {

const char kEtcdApiVersion[] = CAPSTAN_ETCD_API_VERSION;
const char kEtcdClusterVersion[] = CAPSTAN_ETCD_CLUSTER_VERSION;
const char kEtcdStorageVersion[] = CAPSTAN_ETCD_CLUSTER_VERSION;
const char kCapstanVersion[] = CAPSTAN_VERSION;

}  // namespace capstan::server
