// CudaTransport: region setup and IPC exchange, the heap, and the transport operations as held-back ops
// that the launcher enqueues (NOTE [op fusion]).
#include "cuda_transport.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <sstream>

#include "cuda_check.h"
#include "device_region.h"
#include "error_record.h"
#include "gfdit/settings.h"
#include "ipc.h"
#include "kernels.h"
#include "launcher.h"

namespace gfdit {
namespace cuda {
namespace {

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Makes `device` the calling thread's current CUDA device for one entry point and restores the caller's on
// the way out. CUDA's current device is per host thread and the transport is called from whatever thread
// runs the collective (a Python thread, an engine worker) with whatever device it last chose: a launch or
// allocation would go to that device (a launch on our stream from another device fails, cudaMalloc
// silently allocates there), and the caller's own work must not find its device changed by ours.
class DeviceGuard {
 public:
  /// Throws kSystemError when CUDA cannot read or switch the current device.
  explicit DeviceGuard(int device) {
    GFDIT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) {
      GFDIT_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  /// Best effort, for destructors: when CUDA cannot switch, the calls that follow fail on their own.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device && cudaSetDevice(device) == cudaSuccess) {
      switched_ = true;
    }
    cudaGetLastError();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// NOTE [op fusion]
// Every operation is held back until the next one arrives (or flush / end): a publish or consumed that
// follows appends its signal to the held operation, so a staging copy and its publishes, or a reduction
// and its consumed marks, are one kernel launch. Holding never reorders anything: a signal appended to
// the held operation is stored after that operation's body, exactly where a separate kernel enqueued
// after it would store it, and waits are only appended to a held operation that has no body and no
// signal (consecutive awaitConsumed). So the device work is the enqueue order of the host protocol, which
// is what makes it deadlock-free (every device wait targets a signal that its peer enqueued before the
// host message that made this rank enqueue the wait).
struct HeldOp {
  enum Body { kNone, kCopy, kReduce };
  bool active = false;
  DeviceOp op = DeviceOp::kNone;
  Body body = kNone;
  std::vector<DeviceWait> waits;
  std::vector<DeviceSignal> signals;
  CopySpec copy;
  CopyPath path = CopyPath::kCudaSm;
  DeviceReduce reduce{};
};

class CudaTransportImpl final : public CudaTransport {
 public:
  CudaTransportImpl(int rank, int world_size, int device, const CudaTransportOptions& options)
      : rank_(rank), size_(world_size), device_(device), options_(options) {}

  ~CudaTransportImpl() override {
    // Best effort and bounded: the held operation goes out and everything enqueued runs (each wait is
    // bounded by the timeout), then the mappings close. Peers must be done with this region (a world
    // barrier before destruction), as with the host region. A setup that failed before choosing the device
    // has nothing on it to free.
    if (!device_set_) return;
    DeviceGuard guard(device_, std::nothrow);
    try {
      flush();
    } catch (...) {
    }
    if (done_event_ != nullptr) {
      if (have_prev_) cudaEventSynchronize(done_event_);
      cudaEventDestroy(done_event_);
    }
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && peers_[p] != nullptr) cudaIpcCloseMemHandle(peers_[p]);
    }
    if (region_ != nullptr) cudaFree(region_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (abort_stream_ != nullptr) cudaStreamDestroy(abort_stream_);
    if (abort_word_ != nullptr) cudaFreeHost(abort_word_);
    if (record_ != nullptr) cudaFreeHost(record_);
    cudaGetLastError();
  }

  void setup(Store& store, const std::string& key_prefix) {
    GFDIT_CHECK(size_ >= 1 && size_ <= kMaxRanks) << "world size " << size_ << " is outside [1, " << kMaxRanks << "]";
    GFDIT_CHECK(rank_ >= 0 && rank_ < size_) << "rank " << rank_ << " is outside [0, " << size_ << ")";
    GFDIT_CHECK(options_.timeout.count() > 0) << "timeout must be positive";
    int count = 0;
    GFDIT_CUDA_CHECK(cudaGetDeviceCount(&count));
    GFDIT_CHECK(device_ >= 0 && device_ < count)
        << "gfdit: CUDA device " << device_ << " does not exist (" << count << " visible)";
    GFDIT_CUDA_CHECK(cudaSetDevice(device_));
    device_set_ = true;
    int uva = 0;
    GFDIT_CUDA_CHECK(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, device_));
    GFDIT_CHECK_CODE(kSystemError, uva != 0) << "gfdit: CUDA device " << device_ << " lacks unified addressing";
    prepareKernels();
    bool tma = tmaKernelActive();

    // Sizes: see CudaTransportOptions.
    slot_bytes_ = alignUp(options_.slot_bytes ? options_.slot_bytes : settings::cudaSlotBytes(), kDeviceAlign);
    num_slots_ = options_.num_slots ? options_.num_slots : settings::cudaNumSlots(size_);
    // see NOTE [staging rounds] in the protocol engine: fewer than world_size - 1 slots could deadlock a reduction
    num_slots_ = std::max<size_t>({num_slots_, static_cast<size_t>(size_ - 1), 2});
    heap_bytes_ = alignUp(options_.heap_bytes, kDeviceAlign);
    int max_sm = options_.max_sm_blocks > 0 ? options_.max_sm_blocks : settings::cudaCopyBlocks();
    int max_tma = options_.max_tma_blocks > 0 ? options_.max_tma_blocks : 16;
    table_ = resolveCopyTable(options_.copy_table, tma);

    staging_offset_ = alignUp(sizeof(DeviceSignals), kDeviceAlign);
    heap_offset_ = alignUp(staging_offset_ + slot_bytes_ * num_slots_, kDeviceAlign);
    total_bytes_ = heap_offset_ + heap_bytes_;

    // The region: signal area zeroed (every counter starts at 0), then the header.
    void* region = nullptr;
    GFDIT_CUDA_CHECK(cudaMalloc(&region, total_bytes_));
    region_ = static_cast<uint8_t*>(region);
    signals_ = reinterpret_cast<DeviceSignals*>(region_);
    GFDIT_CUDA_CHECK(cudaMemset(region_, 0, staging_offset_));
    DeviceSignals header{};
    header.magic = kDeviceRegionMagic;
    header.version = kDeviceLayoutVersion;
    header.rank = rank_;
    header.world_size = size_;
    header.device = device_;
    header.total_bytes = total_bytes_;
    header.staging_offset = staging_offset_;
    header.slot_bytes = slot_bytes_;
    header.num_slots = num_slots_;
    header.heap_offset = heap_offset_;
    header.heap_bytes = heap_bytes_;
    // Only the fields before `failed` are written; the counters stay as cudaMemset left them.
    GFDIT_CUDA_CHECK(cudaMemcpy(region_, &header, offsetof(DeviceSignals, failed), cudaMemcpyHostToDevice));
    GFDIT_CUDA_CHECK(cudaDeviceSynchronize());
    heap_.reset(heap_bytes_, 256);

    // The error record and the abort word: pinned host memory the device reads and writes directly.
    void* rec = nullptr;
    GFDIT_CUDA_CHECK(cudaHostAlloc(&rec, sizeof(ErrorRecord), cudaHostAllocMapped));
    record_ = static_cast<ErrorRecord*>(rec);
    std::memset(record_, 0, sizeof(ErrorRecord));
    void* rec_dev = nullptr;
    GFDIT_CUDA_CHECK(cudaHostGetDevicePointer(&rec_dev, rec, 0));
    void* word = nullptr;
    GFDIT_CUDA_CHECK(cudaHostAlloc(&word, sizeof(uint64_t), cudaHostAllocDefault));
    abort_word_ = static_cast<uint64_t*>(word);
    *abort_word_ = 2;  // `failed` set by the host (a kernel sets 1)
    GFDIT_CUDA_CHECK(cudaStreamCreateWithFlags(&abort_stream_, cudaStreamNonBlocking));
    GFDIT_CUDA_CHECK(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming));
    launcher_ = std::make_unique<OpLauncher>(signals_, static_cast<ErrorRecord*>(rec_dev), rank_, timeoutNs(), max_sm,
                                             max_tma, tma);

    // Rendezvous: announce the region, open every peer's.
    cudaIpcMemHandle_t handle;
    GFDIT_CUDA_CHECK(cudaIpcGetMemHandle(&handle, region_));
    cudaDeviceProp prop{};
    GFDIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    RegionAnnouncement own;
    own.handle = hexEncode(&handle, sizeof(handle));
    own.uuid = hexEncode(&prop.uuid, sizeof(prop.uuid));
    own.total_bytes = total_bytes_;
    own.slot_bytes = slot_bytes_;
    own.num_slots = num_slots_;
    own.heap_bytes = heap_bytes_;
    own.device = device_;
    own.pid = static_cast<int>(::getpid());
    std::string prefix = key_prefix + "/cuda-region/";
    store.set(prefix + std::to_string(rank_), encodeAnnouncement(own));
    peers_.assign(static_cast<size_t>(size_), nullptr);
    peer_signals_.assign(static_cast<size_t>(size_), nullptr);
    peers_[rank_] = region_;
    peer_signals_[rank_] = signals_;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      RegionAnnouncement a = parseAnnouncement(store.get(prefix + std::to_string(p)));
      GFDIT_CHECK(a.slot_bytes == slot_bytes_ && a.num_slots == num_slots_ && a.heap_bytes == heap_bytes_ &&
                  a.total_bytes == total_bytes_)
          << "gfdit: rank " << p << "'s device region has " << a.num_slots << " slots of " << a.slot_bytes
          << " bytes and a heap of " << a.heap_bytes << ", rank " << rank_ << "'s " << num_slots_ << " of "
          << slot_bytes_ << " and " << heap_bytes_ << ": every rank needs the same sizes";
      cudaIpcMemHandle_t ph;
      hexDecode(a.handle, &ph, sizeof(ph));
      void* mapped = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&mapped, ph, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaGetLastError();
        GFDIT_THROW(kSystemError) << "gfdit: rank " << rank_ << " (device " << device_ << ") cannot open rank " << p
                                  << "'s device region (pid " << a.pid << ", device " << a.device << ", "
                                  << (a.uuid == own.uuid ? "the same GPU" : "another GPU: is peer access possible?")
                                  << "): cudaIpcOpenMemHandle: " << cudaGetErrorString(e);
      }
      peers_[p] = static_cast<uint8_t*>(mapped);
      peer_signals_[p] = reinterpret_cast<DeviceSignals*>(mapped);
      DeviceSignals ph_header{};
      GFDIT_CUDA_CHECK(cudaMemcpy(&ph_header, mapped, offsetof(DeviceSignals, failed), cudaMemcpyDeviceToHost));
      GFDIT_CHECK(ph_header.magic == kDeviceRegionMagic && ph_header.version == kDeviceLayoutVersion &&
                  ph_header.rank == p && ph_header.world_size == size_)
          << "gfdit: rank " << p << "'s device region does not match this build or world";
    }
  }

  // ---- Transport: memory ----

  TransportKind kind() const override { return TransportKind::kCuda; }
  uint8_t* base() const override { return region_; }
  uint8_t* peerBase(int peer) const override { return peers_.at(static_cast<size_t>(peer)); }
  size_t slotBytes() const override { return slot_bytes_; }
  size_t numSlots() const override { return num_slots_; }
  uint8_t* slot(size_t k) const override { return region_ + staging_offset_ + k * slot_bytes_; }

  // ---- Transport: a collective ----

  void begin(void* stream) override {
    DeviceGuard guard(device_);
    if (held_.active) {
      // The previous collective's end() failed part way (the engine ends every collective, also after an
      // error, and records what end() reports): its last operation still goes out, on its own stream, ahead
      // of anything of this one.
      flush();
      GFDIT_CUDA_CHECK(cudaEventRecord(done_event_, cur_));
      prev_stream_ = cur_;
      have_prev_ = true;
    }
    checkErrors();
    cur_ = static_cast<cudaStream_t>(stream);
    // One transport's operations run one after another whatever stream each collective uses: the
    // arrival counter (NOTE [op kernels]) and the edges' message order both rely on it.
    if (have_prev_ && prev_stream_ != cur_) GFDIT_CUDA_CHECK(cudaStreamWaitEvent(cur_, done_event_, 0));
    in_collective_ = true;
  }

  void end() override {
    DeviceGuard guard(device_);
    flush();
    GFDIT_CUDA_CHECK(cudaEventRecord(done_event_, cur_));
    prev_stream_ = cur_;
    have_prev_ = true;
    in_collective_ = false;
  }

  void copyLocal(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off, size_t bytes) override {
    HeldOp op;
    op.op = DeviceOp::kCopyLocal;
    setCopy(op, deviceView(dst), dst_off, deviceView(src), src_off, bytes);
    hold(std::move(op));
  }

  void stage(uint8_t* slot, const BufferView& src, size_t src_off, size_t bytes, const SlotUse* prior,
             int num_prior) override {
    HeldOp op;
    op.op = DeviceOp::kStage;
    for (int k = 0; k < num_prior; ++k) {
      checkPeer(prior[k].peer);
      // Before overwriting: the slot's earlier receivers finished reading (acquire of their release).
      op.waits.push_back(DeviceWait{&signals_->consumed[prior[k].peer].value, prior[k].seq,
                                    &peer_signals_.at(static_cast<size_t>(prior[k].peer))->failed, prior[k].peer,
                                    static_cast<uint32_t>(DeviceWaitKind::kConsumed)});
    }
    setCopy(op, deviceView(slot, bytes), 0, deviceView(src), src_off, bytes);
    hold(std::move(op));
  }

  void publish(int peer, uint64_t seq) override {
    checkPeer(peer);
    // ready[self] in the receiver's region = seq, after the bytes (release, system scope).
    addSignal(DeviceOp::kPublish, DeviceSignal{&peer_signals_.at(static_cast<size_t>(peer))->ready[rank_].value, seq,
                                               nullptr, peer, static_cast<uint32_t>(DeviceWaitKind::kReady)});
  }

  void consume(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off, size_t bytes, int peer,
               uint64_t seq) override {
    checkPeer(peer);
    HeldOp op;
    op.op = DeviceOp::kConsume;
    op.waits.push_back(readyWait(peer, seq));
    setCopy(op, deviceView(dst), dst_off, deviceView(src), src_off, bytes);
    op.signals.push_back(consumedSignal(peer, seq));
    hold(std::move(op));
  }

  void reduce(uint8_t* out, const uint8_t* const* contribs, int n, int first, size_t count, DType dtype, ReduceOp rop,
              bool acc, const SlotUse* arrivals, int num_arrivals) override {
    GFDIT_CHECK(n >= 1 && n <= kMaxRanks && first >= 0 && first < n)
        << "gfdit: reduce of " << n << " contributions starting at " << first;
    HeldOp op;
    op.op = DeviceOp::kReduce;
    for (int k = 0; k < num_arrivals; ++k) checkPeer(arrivals[k].peer);
    for (int k = 0; k < num_arrivals; ++k) op.waits.push_back(readyWait(arrivals[k].peer, arrivals[k].seq));
    op.body = HeldOp::kReduce;
    // The accumulator is a register: 16-bit floats always go through float32 and round once at the end,
    // which is what `acc` asks for; without `acc` the engine passes out == contribs[first] or a block it
    // may overwrite, and the result is the same (see reduce.cpp: 16-bit floats always accumulate in float32).
    (void)acc;
    for (int j = 0; j < n; ++j) op.reduce.contribs[j] = contribs[j];
    op.reduce.out = out;
    op.reduce.count = count;
    op.reduce.n = n;
    op.reduce.first = first;
    op.reduce.dtype = static_cast<uint32_t>(dtype);
    op.reduce.op = static_cast<uint32_t>(rop);
    hold(std::move(op));
  }

  void consumed(int peer, uint64_t seq) override {
    checkPeer(peer);
    addSignal(DeviceOp::kConsumed, consumedSignal(peer, seq));
  }

  void awaitConsumed(int peer, uint64_t seq) override {
    checkPeer(peer);
    DeviceWait w{&signals_->consumed[peer].value, seq, &peer_signals_.at(static_cast<size_t>(peer))->failed, peer,
                 static_cast<uint32_t>(DeviceWaitKind::kConsumed)};
    if (held_.active && held_.body == HeldOp::kNone && held_.signals.empty() &&
        held_.waits.size() < static_cast<size_t>(kMaxOpWaits)) {
      held_.waits.push_back(w);  // consecutive awaitConsumed: one wait kernel
      return;
    }
    HeldOp op;
    op.op = DeviceOp::kAwaitConsumed;
    op.waits.push_back(w);
    hold(std::move(op));
  }

  void putWithSignal(int peer, size_t remote_heap_offset, const void* src, size_t bytes) override {
    checkPeer(peer);
    GFDIT_CHECK(bytes <= heap_bytes_ && remote_heap_offset <= heap_bytes_ - bytes)
        << "gfdit: device put of " << bytes << " bytes at heap offset " << remote_heap_offset << " overruns rank "
        << peer << "'s device heap of " << heap_bytes_ << " bytes";
    HeldOp op;
    op.op = DeviceOp::kPutSignal;
    uint8_t* dst = peers_.at(static_cast<size_t>(peer)) + heap_offset_ + remote_heap_offset;
    setCopy(op, deviceView(dst, bytes), 0, deviceView(const_cast<void*>(src), bytes), 0, bytes);
    // put_signal[self] in the peer's region = the count of our puts, after the bytes (release, system scope).
    op.signals.push_back(DeviceSignal{&peer_signals_.at(static_cast<size_t>(peer))->put_signal[rank_].value,
                                      ++puts_sent_[peer], nullptr, peer,
                                      static_cast<uint32_t>(DeviceWaitKind::kPutSignal)});
    hold(std::move(op));
  }

  void waitPuts(int peer, uint64_t count) override {
    checkPeer(peer);
    puts_seen_[peer] += count;
    HeldOp op;
    op.op = DeviceOp::kWaitSignal;
    // acquire of the peer's release: its bytes are visible to what this stream runs next
    op.waits.push_back(DeviceWait{&signals_->put_signal[peer].value, puts_seen_[peer],
                                  &peer_signals_.at(static_cast<size_t>(peer))->failed, peer,
                                  static_cast<uint32_t>(DeviceWaitKind::kPutSignal)});
    hold(std::move(op));
  }

  // Every operation of the transport (copyLocal, stage, publish, consume, reduce, ...) launches through here
  // (hold() flushes the operation held before it), so this guard covers them all.
  void flush() override {
    if (!held_.active) return;
    DeviceGuard guard(device_);
    HeldOp op = std::move(held_);
    held_ = HeldOp{};
    try {
      if (op.body == HeldOp::kReduce) {
        launcher_->reduceOp(op.op, op.waits, op.reduce, op.signals, cur_);
      } else {
        launcher_->copyOp(op.op, op.waits, op.body == HeldOp::kCopy ? &op.copy : nullptr, op.path, op.signals, cur_);
      }
    } catch (const Error& e) {
      // A launch failed: the device counters no longer match what this host expects.
      broken_ = e.what();
      throw;
    }
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "cuda ipc device " << device_ << " " << table_.toString();
    return os.str();
  }

  // ---- CudaTransport ----

  int device() const override { return device_; }

  void* heapAlloc(size_t bytes) override {
    size_t off = heap_.alloc(bytes);
    if (off == core::HeapAllocator::kNone) {
      GFDIT_THROW(kInvalidUsage) << "gfdit: device heap exhausted: " << bytes << " bytes requested, " << heap_.used()
                                 << " of " << heap_bytes_ << " in use (raise heap_bytes)";
    }
    return region_ + heap_offset_ + off;
  }

  void heapFree(void* ptr) override {
    GFDIT_CHECK(heap_.free(heapOffset(ptr))) << "gfdit: heapFree of a pointer not from heapAlloc";
  }

  uint8_t* heapBase() const override { return region_ + heap_offset_; }
  size_t heapCapacity() const override { return heap_bytes_; }
  core::HeapAllocator& heap() override { return heap_; }

  uint8_t* scratch(size_t bytes) override {
    if (scratch_bytes_ < bytes) {
      DeviceGuard guard(device_);
      // Grown rarely (the largest one-shot all-reduce so far): the old buffer may still be read by work
      // already enqueued, so the device drains before it goes.
      flush();
      if (scratch_ != nullptr) {
        GFDIT_CUDA_CHECK(cudaDeviceSynchronize());
        GFDIT_CUDA_CHECK(cudaFree(scratch_));
        scratch_ = nullptr;
        scratch_bytes_ = 0;
      }
      GFDIT_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  size_t heapOffset(const void* ptr) const override {
    GFDIT_CHECK(inHeap(ptr, 1)) << "gfdit: pointer is not in the device heap";
    return static_cast<size_t>(static_cast<const uint8_t*>(ptr) - (region_ + heap_offset_));
  }

  size_t heapBytes() const override { return heap_bytes_; }

  void checkErrors() override {
    // acquire: the kernel wrote the fields, fenced, then state (NOTE [cuda transport handshake]).
    if (__atomic_load_n(&record_->state, __ATOMIC_ACQUIRE) != 0) {
      ErrorRecord r;
      std::memcpy(&r, record_, sizeof(r));
      throw Error(errorCodeOf(r), formatError(r));
    }
    if (aborted_) {
      throw Error(ErrorCode::kRemoteError, "gfdit: cuda transport of rank " + std::to_string(rank_) +
                                               " was aborted; its device operations stopped");
    }
    if (!broken_.empty()) {
      throw Error(ErrorCode::kSystemError, "gfdit: cuda transport of rank " + std::to_string(rank_) +
                                               " is unusable after a failed launch: " + broken_);
    }
  }

  void abort() override {
    if (aborted_) return;
    DeviceGuard guard(device_);
    aborted_ = true;
    // failed = 2 through a stream of its own that does not wait for the collective's streams, so spinning
    // kernels of this rank see it (and stop) and so do peers waiting on this rank.
    GFDIT_CUDA_CHECK(
        cudaMemcpyAsync(&signals_->failed, abort_word_, sizeof(uint64_t), cudaMemcpyHostToDevice, abort_stream_));
    GFDIT_CUDA_CHECK(cudaStreamSynchronize(abort_stream_));
  }

  void setTimeout(std::chrono::milliseconds timeout) override {
    GFDIT_CHECK(timeout.count() > 0) << "timeout must be positive";
    options_.timeout = timeout;
    launcher_->setTimeout(timeoutNs());
  }

  const CopySelector& copyTable() const override { return table_; }

  void synchronize() override {
    DeviceGuard guard(device_);
    flush();
    if (in_collective_) {
      GFDIT_CUDA_CHECK(cudaStreamSynchronize(cur_));
    } else if (have_prev_) {
      GFDIT_CUDA_CHECK(cudaEventSynchronize(done_event_));
    }
    checkErrors();
  }

 private:
  void checkPeer(int peer) const {
    GFDIT_CHECK(peer >= 0 && peer < size_ && peer != rank_)
        << "gfdit: rank " << rank_ << "'s cuda transport: " << peer << " is not a peer in a world of " << size_;
  }

  uint64_t timeoutNs() const { return static_cast<uint64_t>(options_.timeout.count()) * 1000000ull; }

  DeviceWait readyWait(int peer, uint64_t seq) const {
    // The peer's bytes of message seq are complete (acquire of its release into our region).
    return DeviceWait{&signals_->ready[peer].value, seq, &peer_signals_.at(static_cast<size_t>(peer))->failed, peer,
                      static_cast<uint32_t>(DeviceWaitKind::kReady)};
  }

  DeviceSignal consumedSignal(int peer, uint64_t seq) const {
    // consumed[self] in the sender's region = seq, after our reads (release); skipped, and reported, if
    // the sender failed meanwhile (NOTE [cuda transport handshake]).
    const DeviceSignals* ps = peer_signals_.at(static_cast<size_t>(peer));
    return DeviceSignal{&peer_signals_.at(static_cast<size_t>(peer))->consumed[rank_].value, seq, &ps->failed, peer,
                        static_cast<uint32_t>(DeviceWaitKind::kReadCheck)};
  }

  void setCopy(HeldOp& op, const DeviceView& dst, size_t dst_off, const DeviceView& src, size_t src_off, size_t bytes) {
    op.body = HeldOp::kCopy;
    op.copy.dst = dst;
    op.copy.dst_off = dst_off;
    op.copy.src = src;
    op.copy.src_off = src_off;
    op.copy.bytes = bytes;
    op.path = table_.pick(bytes);
  }

  void hold(HeldOp&& op) {
    flush();
    held_ = std::move(op);
    held_.active = true;
  }

  void addSignal(DeviceOp kind, const DeviceSignal& s) {
    if (held_.active && held_.signals.size() < static_cast<size_t>(kMaxOpSignals)) {
      held_.signals.push_back(s);  // stored after the held operation's body: see NOTE [op fusion]
      return;
    }
    HeldOp op;
    op.op = kind;
    op.signals.push_back(s);
    hold(std::move(op));
  }

  int rank_;
  int size_;
  int device_;
  CudaTransportOptions options_;
  bool device_set_ = false;
  size_t slot_bytes_ = 0, num_slots_ = 0, heap_bytes_ = 0;
  size_t staging_offset_ = 0, heap_offset_ = 0, total_bytes_ = 0;
  uint8_t* region_ = nullptr;
  DeviceSignals* signals_ = nullptr;
  std::vector<uint8_t*> peers_;               // peer regions as mapped here (own at [rank_])
  std::vector<DeviceSignals*> peer_signals_;  // their signal areas
  ErrorRecord* record_ = nullptr;             // host pointer of the host-mapped record
  uint64_t* abort_word_ = nullptr;            // pinned source of abort()'s write
  cudaStream_t abort_stream_ = nullptr;
  cudaEvent_t done_event_ = nullptr;  // recorded at every end()
  cudaStream_t cur_ = nullptr, prev_stream_ = nullptr;
  bool have_prev_ = false, in_collective_ = false, aborted_ = false;
  std::string broken_;
  CopySelector table_;
  std::unique_ptr<OpLauncher> launcher_;
  HeldOp held_;

  core::HeapAllocator heap_;
  uint64_t puts_sent_[kMaxRanks] = {};  // one-sided puts to each peer, and from each peer waited for
  uint64_t puts_seen_[kMaxRanks] = {};
  uint8_t* scratch_ = nullptr;  // one-shot all-reduce results (device memory)
  size_t scratch_bytes_ = 0;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<CudaTransport> makeCudaTransport(int rank, int world_size, int device, Store& store,
                                                 const std::string& key_prefix, const CudaTransportOptions& options) {
  auto t = std::make_unique<cuda::CudaTransportImpl>(rank, world_size, device, options);
  t->setup(store, key_prefix);
  return t;
}

}  // namespace gfdit
