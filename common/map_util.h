// FindOrNull: a map's value for a key, or null. The lookup every owner of a
// table offers (a host, a job, a push, an aggregate, a copy by its id), in
// one place, for const and non-const maps alike:
//
//   std::map<uint64_t, Record> records;
//   if (Record* record = FindOrNull(records, id)) record->done = true;
//
// Thread safety: as the map's.
#ifndef MLFABRIC_COMMON_MAP_UTIL_H_
#define MLFABRIC_COMMON_MAP_UTIL_H_

namespace mlfabric {

// Works with any map whose find() returns an iterator to a pair (std::map,
// std::unordered_map, absl's maps); the pointer is const when the map is.
template <typename Map, typename Key>
auto* FindOrNull(Map& map, const Key& key) {
  auto it = map.find(key);
  return it == map.end() ? nullptr : &it->second;
}

}  // namespace mlfabric

#endif  // MLFABRIC_COMMON_MAP_UTIL_H_
