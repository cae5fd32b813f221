// The decoder-only MoE language model: embedding, L blocks, final RMSNorm,
// LM head fused with the cross-entropy (processed in token chunks).
// Under tensor parallelism (nn/tensor_parallel.h) the embedding and head are
// vocab-parallel and the cross-entropy is nn/vocab_parallel_ce.h.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "moetron/nn/block.h"
#include "moetron/nn/context_parallel.h"
#include "moetron/nn/multimodal_batch.h"
#include "moetron/nn/multimodal_config.h"
#include "moetron/nn/recompute.h"

namespace moetron::nn {

class MediaFusion;

struct LossStats {
  double ce_sum = 0;   // sum of token cross-entropies (nats)
  int64_t tokens = 0;  // tokens with a target (>= 0)
  // Summed over MoE layers, coefficients applied: the balancing losses,
  // modality routing's entropy terms included.
  double aux_loss = 0;
  double z_loss = 0;
  int64_t dropped = 0;  // capacity drops over MoE layers
  // Wall time of the passes (forward_backward: forward up to the loss and its
  // gradient, then backward), for monitoring.
  double forward_s = 0, backward_s = 0;
  // Multimodal batches (nn/multimodal_batch.h): the cross-entropy sum and
  // target tokens of each task (empty otherwise).
  std::vector<double> task_ce_sum;
  std::vector<int64_t> task_tokens;
  // With backward: each task's sum of squares of the loss gradient wrt the
  // final norm's output (the last representation every task shares), over
  // the rows this rank holds (a slice under sequence parallelism). GradNorm
  // reads it (train/multitask_balance.h).
  std::vector<double> task_grad_sq;
  // Adds another micro-batch's (or chunk's) per-task sums to these.
  void add_tasks(const LossStats& o);
};

// Pipeline parallelism: the layers this rank holds, as chunks (virtual
// stages) in model order; the rank holding virtual stage 0 also holds the
// embedding, the one holding the last virtual stage the final norm and head.
struct PipelinePlace {
  std::vector<std::pair<int64_t, int64_t>>
      chunks;  // [first, end) layers; empty: every layer, one chunk
  bool embedding = true, head = true;
};

class Transformer {
 public:
  Transformer(const ModelConfig& model, const MoeConfig& moe, Precision prec,
              ExpertParallel ep = {}, TensorParallel tp = {}, PipelinePlace place = {});
  // The blocks point at tp_: a Transformer stays where it was built.
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;
  ~Transformer();

  // Multimodal (nn/media_fusion.h): builds the encoders on the rank holding
  // the embedding (their parameters join params()) and, for cross-attention
  // fusion (cfg.cross_attention_at), a gated cross-attention layer in the
  // blocks it names (their parameters first, in block order); call before
  // initialize() and before anything reads the parameter list. Not with
  // context parallelism; cross-attention not with pipeline or sequence
  // parallelism (tp: replicated, see Block::add_cross_attention).
  void enable_media(const MultimodalModelConfig& cfg);
  bool has_media() const { return media_ != nullptr; }
  const MediaFusion* media() const { return media_.get(); }
  // The multimodal batch of the next forwards (forward_backward,
  // last_logits, and chunk_forward when its ChunkStep names none); nullptr:
  // plain text.
  void set_multimodal(std::shared_ptr<const MultimodalBatch> batch) {
    multimodal_ = std::move(batch);
  }

  ParameterSet& params() { return params_; }
  const ModelConfig& config() const { return model_; }
  const MoeConfig& moe_config() const { return moe_; }
  Precision precision() const { return prec_; }
  void initialize(uint64_t seed) { params_.initialize(seed); }

  // inputs, targets: i32 [B, S]; a target < 0 is not counted. With
  // backward = true, parameter gradients accumulate the gradient of
  //   grad_scale * sum_t ce_t + loss_weight * (balancing losses)
  // (grad_scale = 1 / tokens of the whole step, loss_weight = this
  // micro-batch's share of them), so micro-batches add up to one batch.
  LossStats forward_backward(kernels::Context& ctx, const Tensor& inputs, const Tensor& targets,
                             double grad_scale, double loss_weight, bool backward);
  // Pipeline parallelism (train/pipeline_runner.cpp drives these):
  // forward of this rank's chunk `at.chunk` on micro-batch `at.mb`. `in` is the
  // token ids (i32 [B, S]) on the chunk with the embedding, else the
  // previous stage's activations [B * S (/ tp under sp), D]; `targets` are
  // read on the chunk with the head. Returns the activations for the next
  // stage (undefined after the head). With at.backward, what backward
  // needs is kept per (chunk, mb) until chunk_backward; the head's loss
  // gradient is computed here (like forward_backward).
  struct ChunkStep {
    int64_t chunk = 0, mb = 0;
    int64_t batch = 0, seq = 0;              // the micro-batch's rows and sequence length
    double grad_scale = 0, loss_weight = 0;  // as for forward_backward
    bool backward = false;
    // The micro-batch's token ids [B, S], on every stage: with a document
    // separator, positions (and the attention mask) follow its documents.
    Tensor ids;
    // i32 [B * S] RoPE positions when the rows are a chunk of longer
    // sequences (train.seq_chunk); undefined: computed from ids.
    Tensor positions = Tensor();
    // Under recompute full / sqrt, checkpoint the last segment too and keep
    // the head's input instead of its gradient (the head runs again in
    // backward): what a sequence chunk keeps until its turn comes.
    bool checkpoint_all = false;
    // The micro-batch's media, tasks and token modalities (nullptr: the one
    // set_multimodal gave, if any).
    std::shared_ptr<const MultimodalBatch> multimodal = nullptr;
  };
  Tensor chunk_forward(kernels::Context& ctx, const ChunkStep& at, const Tensor& in,
                       const Tensor& targets, LossStats& stats);
  // Backward of a kept (chunk, mb): d_out is the next stage's gradient
  // (ignored after the head); returns the gradient for the previous stage
  // (undefined before the embedding). on_grad_ready fires only with
  // final_grads (the step's last micro-batch through this chunk).
  Tensor chunk_backward(kernels::Context& ctx, int64_t chunk, int64_t mb, const Tensor& d_out,
                        bool final_grads);
  int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // This rank's blocks (a pipeline stage's layers), in model order.
  const std::vector<std::unique_ptr<Block>>& blocks() const { return blocks_; }
  bool holds_embedding() const { return embed_ != nullptr; }
  bool holds_head() const { return head_ != nullptr; }

  // Logits of the last `positions` positions of every row, [B * positions, V]
  // in fp32/f64 (row b * positions + j: position S - positions + j), for
  // sampling (one position) and for scoring the end of a sequence.
  Tensor last_logits(kernels::Context& ctx, const Tensor& inputs, int64_t positions = 1);

  std::vector<MoeLayer*> moe_layers();
  int64_t ce_chunk_tokens = 1024;

  // Called during backward, once per parameter, as soon as that parameter's
  // gradient of this micro-batch is complete: head and final norm first,
  // then each block's parameters as the block finishes, the embedding last
  // (a tied embedding once, at the end). The data-parallel reducer starts a
  // bucket's reduction from here.
  std::function<void(Parameter&)> on_grad_ready;
  // Called before a forward first reads a parameter's value (the embedding,
  // each block's parameters as the block starts, final norm and head): ZeRO-1
  // completes that parameter's all-gather from here (optim/zero_optimizer.h).
  std::function<void(Parameter&)> before_use;
  // Ranks that split each micro-batch (dp); see MoeLayer::set_balance_group.
  // Training forwards use it; evaluation forwards use local statistics.
  void set_balance_group(comm::Communicator* group) { balance_group_ = group; }
  // The ep ranks that share one copy of the experts (nn/moe_dispatch.cpp);
  // required when built with ExpertParallel::size > 1.
  void set_expert_group(comm::Communicator* group);
  // The tp ranks (ordered by tp rank) sharing each micro-batch; required
  // when built with TensorParallel::size > 1. Collective over `group`.
  // Under a 2-D grid (TensorParallel::grid_rows > 1) `group` is the whole
  // grid, R x C ranks, which this splits into its rows and columns.
  void set_tensor_group(comm::Communicator* group);
  // What the modules run: under a 2-D grid, this rank's grid row.
  const TensorParallel& tensor_parallel() const { return tp_; }
  // Over which ranks the tp-sharded parameters' blocks are spread (gathering
  // a whole tensor, counting each block once): the tp group, or under a 2-D
  // grid the whole grid.
  const TensorParallel& parameter_parallel() const { return tp_.grid() ? grid_tp_ : tp_; }
  // A 2-D grid's row and column communicators (nullptr without a grid).
  const comm::Communicator* grid_row_comm() const { return grid_row_group_.get(); }
  const comm::Communicator* grid_column_comm() const { return grid_column_group_.get(); }
  // Activation recomputation (nn/recompute.h, transformer_recompute.cpp);
  // none by default. Gradients are the same under every policy.
  void set_recompute(const RecomputePolicy& policy);
  const RecomputePolicy& recompute() const { return recompute_; }
  // Packed documents: a token after `id` (the end-of-document token) starts
  // a new document, positions restart at 0 there and no token attends across
  // it. -1 (the default): each sequence is one document.
  void set_document_separator(int32_t id) { document_separator_ = id; }
  int32_t document_separator() const { return document_separator_; }
  // Chunked sequences (nn/transformer_chunked.cpp): forward_backward runs
  // each batch through the whole model `tokens` positions at a time (the
  // last chunk takes the rest), then backward through the chunks in reverse;
  // attention keeps the keys and values of the whole sequence, the rest of
  // the activations only the chunks' (with the recompute policy, each
  // chunk's checkpoints). Losses and gradients are the unchunked ones, except
  // that the MoE's load-balancing loss and capacity drops see one chunk at a
  // time (as they see one micro-batch). 0: off. One pipeline stage only.
  void set_sequence_chunk(int64_t tokens);
  int64_t sequence_chunk() const { return seq_chunk_; }

  // Context parallelism (nn/context_parallel.h): `group` holds the cp ranks
  // (ordered by cp rank) that split every sequence. forward_backward (and
  // the pipeline runner, through context_slice) then takes the whole
  // micro-batch and runs this rank's two chunks of every row; LossStats
  // count this rank's tokens. Collective-free; not with seq_chunk.
  // all_to_all: attention by all-to-all exchanges (a 1/c share of the heads
  // over the whole sequence per rank) instead of the K/V ring.
  void set_context_group(comm::Communicator* group, bool all_to_all = false);
  const ContextParallel& context_parallel() const { return cp_; }
  // This rank's share of a whole micro-batch (ids, targets: i32 [B, S]):
  // ids and targets [B, 2 S / 2c], RoPE positions i32 [B * 2 S / 2c] in the
  // whole sequence. Sets the sequence length the attention layers split.
  struct ContextSlice {
    Tensor ids, targets, positions;
    int64_t batch = 0, seq = 0;  // seq: this rank's tokens per row
  };
  ContextSlice context_slice(const Tensor& ids, const Tensor& targets);

 private:
  // positions: i32 [B * S] RoPE positions; undefined: positions_of(inputs).
  Tensor hidden_states(kernels::Context& ctx, const Tensor& inputs, double loss_weight,
                       LossStats& stats, const Tensor& positions = Tensor());
  // Final-norm output h -> losses (counted into stats) and, with backward,
  // the gradient wrt h (this rank's rows).
  // mm: the micro-batch's tasks (per-task gradient scales and sums), or nullptr.
  Tensor head_loss(kernels::Context& ctx, const Tensor& h_given, const Tensor& targets,
                   double grad_scale, bool backward, LossStats& stats,
                   const MultimodalBatch* mm = nullptr);
  Tensor embed(kernels::Context& ctx, const Tensor& ids);
  // The embedding's gradient from d_x (every row of `ids`, gathered under sp).
  void embed_backward(kernels::Context& ctx, const Tensor& ids, const Tensor& d_x);
  // Rows [begin, end) of the head's input whose token losses share one
  // gradient scale (task -1: no multimodal batch).
  struct TaskRun {
    int64_t begin = 0, end = 0;
    double grad_scale = 0;
    int32_t task = -1;
  };
  static std::vector<TaskRun> task_runs(const MultimodalBatch* mm, int64_t rows, double grad_scale);
  void count_losses(const MultimodalBatch* mm, const Tensor& tgt, const Tensor& losses,
                    const std::vector<TaskRun>& runs, LossStats& stats) const;
  // Adds each run's sum of squares of d_h (this rank's rows of `rows`) to
  // stats.task_grad_sq.
  void add_task_grad_sq(kernels::Context& ctx, const Tensor& d_h, int64_t rows,
                        const std::vector<TaskRun>& runs, LossStats& stats) const;
  std::shared_ptr<const MultimodalBatch> multimodal_;
  std::unique_ptr<MediaFusion> media_;
  // The media's forward into the embeddings x of `seq` positions per row,
  // and its backward from their gradient (every row's), for batch `mm`.
  // Returns the tokens the cross-attention layers read (kept until backward).
  MediaTokens fuse_media(kernels::Context& ctx, const MultimodalBatch* mm, int64_t seq,
                         const Tensor& x);
  // d_media: the cross-attention layers' summed gradient wrt the tokens.
  void fuse_media_backward(kernels::Context& ctx, const MultimodalBatch* mm, int64_t seq,
                           const Tensor& d_x, const Tensor& d_media);
  // A zero gradient for `media`'s tokens (undefined without tokens).
  Tensor media_grad(const MediaTokens& media) const;
  void media_grads_ready();
  // Gives the MoE layers the batch's token modalities (their token slice
  // under tensor parallelism; all text without a batch).
  void route_by_modality(const MultimodalBatch* mm);
  // i32 [B * S] RoPE positions of token ids [B, S]: 0 .. S - 1 per row, or
  // restarting after each document separator.
  Tensor positions_of(const Tensor& ids, int64_t batch, int64_t seq) const;
  int32_t document_separator_ = -1;
  int64_t seq_chunk_ = 0;
  LossStats forward_backward_chunked(kernels::Context& ctx, const Tensor& inputs,
                                     const Tensor& targets, double grad_scale, double loss_weight,
                                     bool backward);
  ModelConfig model_;
  MoeConfig moe_;
  Precision prec_;
  TensorParallel tp_;   // the blocks hold a pointer to it
  ContextParallel cp_;  // the attention layers hold a pointer to it
  std::unique_ptr<comm::Communicator> kv_group_;
  // 2-D grid: this rank's grid row and column, and the whole grid as a tp group.
  std::unique_ptr<comm::Communicator> grid_row_group_, grid_column_group_;
  TensorParallel grid_tp_;
  ParameterSet params_;
  Parameter* embed_;
  Parameter* final_norm_;
  Parameter* head_;  // == embed_ when tied
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::pair<size_t, size_t>> block_params_;  // [begin, end) in params_.all() per block
  // Per block: its cross-attention layer's parameters ([begin, end), empty without one).
  std::vector<std::pair<size_t, size_t>> cross_params_;
  // Every parameter of block i (its cross-attention layer's included):
  // before_use / on_grad_ready.
  void need_block(size_t i);
  // The vocabulary row of the embedding's (or head's) first row as a kernel
  // sees it (gathered under a 2-D grid).
  int64_t vocab_row0(const Parameter& p) const;
  void block_grads_ready(size_t i);
  std::vector<std::pair<size_t, size_t>> chunks_;  // [begin, end) in blocks_ per chunk
  struct ChunkStash {
    std::vector<Block::State> blocks;  // per block of the chunk (empty for a checkpointed one)
    Tensor ids, x_final, rstd, d_h;
    // Segment checkpoints (recompute full / sqrt): each segment's input and
    // its checkpointed blocks' routing records, for the rebuild in backward.
    std::vector<Tensor> segment_inputs, routing;
    Tensor positions;
    int64_t batch = 0, seq = 0;
    double loss_weight = 0;
    size_t last_segment = 0;  // blocks from here on kept their state
    // checkpoint_all: the head runs again in backward on x_final.
    bool head_deferred = false;
    Tensor targets;
    double grad_scale = 0;
    std::shared_ptr<const MultimodalBatch> multimodal;
    MediaTokens media;  // what the cross-attention layers read
  };
  // The head's forward on the last block's output x: losses into stats,
  // the final norm's 1/rms into st.rstd and, with backward, d_h into st.d_h.
  void head_forward(kernels::Context& ctx, const Tensor& x, const Tensor& targets,
                    double grad_scale, bool backward, ChunkStash& st, LossStats& stats);
  // [start, end) block ranges of a chunk in backward order: the kept last
  // segment, then the checkpointed segments from the last.
  std::vector<std::pair<size_t, size_t>> backward_segments(size_t begin, size_t end,
                                                           size_t last_segment) const;
  std::map<std::pair<int64_t, int64_t>, ChunkStash> stash_;  // by (chunk, micro-batch)
  comm::Communicator* balance_group_ = nullptr;
  void grads_ready(size_t begin, size_t end);
  void need(size_t begin, size_t end);
  void need(Parameter* p);
  void grad_ready(Parameter* p);
  // The blocks' forward and backward under the recompute policy: segment
  // inputs kept as checkpoints, segments recomputed before their backward.
  Tensor forward_blocks(kernels::Context& ctx, Tensor x, const Tensor& positions, int64_t batch,
                        int64_t seq, double loss_weight, MoeStats& stats,
                        const MediaTokens* media = nullptr);
  // d_media: accumulates the cross-attention layers' media gradient (saved_.media's).
  Tensor backward_blocks(kernels::Context& ctx, Tensor d_x, const Tensor& d_media = Tensor());
  void release_checkpoints();
  int64_t last_segment_start() const;
  // The first block (index into blocks_) of the last segment of the chunk
  // [begin, end): blocks before it are checkpointed.
  size_t last_segment_start(size_t begin, size_t end) const;
  RecomputePolicy recompute_;
  struct Checkpoints {
    std::vector<Tensor> inputs;  // input of segment j's first block
    int64_t batch = 0, seq = 0;
    double loss_weight = 0;
  } ckpt_;
  struct Saved {
    Tensor ids, positions, x_final, rstd;
    MediaTokens media;
  } saved_;
};

}  // namespace moetron::nn
